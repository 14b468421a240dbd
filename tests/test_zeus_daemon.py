"""The Zeus optimizers hosted in the daemon, over real gRPC (docs/zeus.md,
"The batch-size optimizer" and "The power-limit optimizer"): registration rules, bad input leaving
state unchanged, durability across restarts (the batch-size sequence continues exactly), the
power-limit optimizer, the trace-driven simulation ``offcut replay zeus`` on the recorded traces,
and, with tokens, jobs' owners."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import grpc

import pandas as pd
import pytest
from typer.testing import CliRunner

from offcut.client.cli import app
from offcut.zeus_views import zeus_cost
from offcut.errors import (AlreadyExists, FailedPrecondition, InvalidArgument, NotFound,
                           PermissionDenied, from_rpc_error)
from offcut.v1 import zeus_pb2
from offcut.zeus_views import ZeusJob

from daemon_helpers import start_secured, zeus_spec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "zeus-nsdi23"
needs_traces = pytest.mark.skipif(not DATA.is_dir(), reason=f"Zeus traces not found at {DATA} "
                                  "(../shared/data/zeus-nsdi23 is not part of the repository)")


def run_trial(client, job_id, converge_at: int | None, epoch_time_s=10.0, epoch_energy_j=2000.0):
    """Predict and report epochs until the daemon says stop; converges at ``converge_at``."""
    pred = client.predict_batch_size(job_id)
    epoch = 0
    while True:
        epoch += 1
        metric = 0.8 if converge_at is not None and epoch >= converge_at else 0.1
        verdict = client.report_epoch(job_id, pred.trial_number, epoch, epoch * epoch_time_s,
                                      epoch * epoch_energy_j, metric)
        if verdict.stop:
            return pred, verdict


def job_state(client, job_id):
    job = client.get_zeus_job(job_id)
    return json.loads(job.state_json)


# ----------------------------------------------------------------------------- registration
def test_register_is_idempotent_and_conflicting_spec_is_already_exists(daemon):
    _, client = daemon
    first = client.register_zeus_job(zeus_spec())
    again = client.register_zeus_job(zeus_spec())
    assert again.spec == first.spec
    assert first.spec.num_pruning_rounds == 2  # default filled in and returned
    with pytest.raises(AlreadyExists, match="spec.job_id"):
        client.register_zeus_job(zeus_spec(default_batch_size=128))
    assert client.get_zeus_job("resnet").spec.default_batch_size == 64


@pytest.mark.parametrize("change, field", [
    (dict(num_pruning_rounds=0), "spec.num_pruning_rounds"),
    (dict(batch_sizes=[]), "spec.batch_sizes"),
    (dict(default_batch_size=48), "spec.default_batch_size"),
    (dict(eta_knob=1.5), "spec.eta_knob"),
    (dict(eta_knob=math.nan), "spec.eta_knob"),
    (dict(beta_knob=0.0), "spec.beta_knob"),
    (dict(max_epochs=0), "spec.max_epochs"),
    (dict(job_id=""), "spec.job_id"),
    (dict(power=zeus_pb2.PowerLimitSpec(min_power_limit_w=300, max_power_limit_w=250)),
     "spec.power."),
    (dict(power=zeus_pb2.PowerLimitSpec(min_power_limit_w=100, max_power_limit_w=250,
                                        selector="fastest")), "spec.power.selector"),
])
def test_invalid_specs_are_rejected_and_nothing_is_registered(daemon, change, field):
    _, client = daemon
    with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
        client.register_zeus_job(zeus_spec(**change))
    with pytest.raises(NotFound, match="job_id"):
        client.get_zeus_job(change.get("job_id") or "resnet")


def test_unknown_job_and_trial_are_not_found(daemon):
    _, client = daemon
    with pytest.raises(NotFound, match="job_id"):
        client.predict_batch_size("nope")
    with pytest.raises(InvalidArgument, match="job_id"):
        client.predict_batch_size("")
    client.register_zeus_job(zeus_spec())
    with pytest.raises(NotFound, match="trial_number"):
        client.report_epoch("resnet", 99, 1, 1.0, 1.0, 0.1)


@pytest.mark.parametrize("epoch, time_s, energy_j, field", [
    (1, math.nan, 10.0, "time_s"),
    (1, 5.0, -1.0, "energy_j"),
    (1, 5.0, math.inf, "energy_j"),
    (0, 5.0, 10.0, "epoch"),
])
def test_bad_reports_change_nothing(daemon, epoch, time_s, energy_j, field):
    _, client = daemon
    client.register_zeus_job(zeus_spec())
    pred = client.predict_batch_size("resnet")
    client.report_epoch("resnet", pred.trial_number, 1, 10.0, 100.0, 0.1)
    before = client.get_zeus_job("resnet").state_json
    with pytest.raises(InvalidArgument, match=field):
        client.report_epoch("resnet", pred.trial_number, epoch, time_s, energy_j, 0.2)
    assert client.get_zeus_job("resnet").state_json == before


def test_a_report_for_a_batch_size_that_was_not_predicted_is_rejected(daemon):
    _, client = daemon
    client.register_zeus_job(zeus_spec())
    pred = client.predict_batch_size("resnet")
    before = client.get_zeus_job("resnet").state_json
    with pytest.raises(FailedPrecondition, match="batch_size"):
        client.report_epoch("resnet", pred.trial_number, 1, 5.0, 10.0, 0.1,
                            batch_size=pred.batch_size * 2)
    assert client.get_zeus_job("resnet").state_json == before
    verdict = client.report_epoch("resnet", pred.trial_number, 1, 5.0, 10.0, 0.1,
                                  batch_size=pred.batch_size)
    assert not verdict.stop


def test_epochs_going_backwards_are_rejected(daemon):
    _, client = daemon
    client.register_zeus_job(zeus_spec())
    pred = client.predict_batch_size("resnet")
    client.report_epoch("resnet", pred.trial_number, 2, 20.0, 100.0, 0.1)
    before = client.get_zeus_job("resnet").state_json
    with pytest.raises((InvalidArgument, FailedPrecondition), match="epoch"):
        client.report_epoch("resnet", pred.trial_number, 1, 25.0, 120.0, 0.1)
    assert client.get_zeus_job("resnet").state_json == before


def test_predict_request_id_makes_a_retry_return_the_same_trial(daemon):
    _, client = daemon
    client.register_zeus_job(zeus_spec())
    a = client.predict_batch_size("resnet", request_id="r1")
    b = client.predict_batch_size("resnet", request_id="r1")
    assert (a.trial_number, a.batch_size) == (b.trial_number, b.batch_size)
    assert len(job_state(client, "resnet")["trials"]) == 1


def test_every_batch_size_failing_is_failed_precondition(daemon):
    _, client = daemon
    client.register_zeus_job(zeus_spec(beta_knob=None, max_epochs=3))
    for _ in range(10):
        try:
            run_trial(client, "resnet", converge_at=None)
        except FailedPrecondition as exc:
            assert "job_id" in str(exc)
            return
    pytest.fail("predict never reported that every batch size failed")


# ----------------------------------------------------------------------------- durability
def _sequence(client, job_id, runs):
    """Batch sizes of ``runs`` runs: converge when the batch size is >= 64, else fail."""
    sizes = []
    for _ in range(runs):
        pred = client.predict_batch_size(job_id)
        converge = pred.batch_size >= 64
        epoch, verdict = 0, None
        while verdict is None or not verdict.stop:
            epoch += 1
            metric = 0.8 if converge and epoch >= 3 else 0.1
            verdict = client.report_epoch(job_id, pred.trial_number, epoch,
                                          epoch * 1000.0 / pred.batch_size, epoch * 50.0, metric)
        sizes.append(pred.batch_size)
    return sizes


def test_restart_continues_the_batch_size_sequence_exactly(daemons):
    srv, client = daemons.start("uninterrupted")
    client.register_zeus_job(zeus_spec(beta_knob=None))
    expected = _sequence(client, "resnet", 24)
    assert len(set(expected)) > 1  # the scenario explores

    srv, client = daemons.start("restarted")
    client.register_zeus_job(zeus_spec(beta_knob=None))
    first = _sequence(client, "resnet", 11)
    daemons.stop(srv)
    srv, client = daemons.start("restarted")
    assert _sequence(client, "resnet", 13) == expected[11:]
    assert first == expected[:11]


# ----------------------------------------------------------------------------- power limits
def test_power_profile_plans_measures_and_is_reused(daemons):
    srv, client = daemons.start()
    client.register_zeus_job(zeus_spec())
    with pytest.raises(FailedPrecondition, match="batch_size"):
        client.power_plan("resnet", 64)  # not predicted yet
    assert client.predict_batch_size("resnet").batch_size == 64
    plan = client.power_plan("resnet", 64)
    assert (plan.action, plan.power_limit_w) == ("profile", 250.0)
    with pytest.raises(FailedPrecondition, match="power_limit_w"):
        client.report_power_window("resnet", 64, 150.0, 10.0, 2000.0)
    plan = client.interrupt_power_window("resnet", 64, 250.0)
    assert plan.power_limit_w == 250.0  # an interrupted window is retried
    # time grows and energy falls as the limit drops; 150 W has the lowest zeus_cost
    measured = {250.0: (10.0, 2500.0), 200.0: (10.5, 2000.0), 150.0: (11.0, 1500.0),
                100.0: (20.0, 1900.0)}
    while plan.action == "profile":
        t, e = measured[plan.power_limit_w]
        plan = client.report_power_window("resnet", 64, plan.power_limit_w, t, e)
    assert (plan.action, plan.power_limit_w) == ("use", 150.0)
    daemons.stop(srv)
    srv, client = daemons.start()
    assert client.power_plan("resnet", 64).power_limit_w == 150.0  # survives a restart
    profile = client.power_profile("resnet", 64)
    assert profile.done and len(profile.measurements) == 4
    with pytest.raises(NotFound, match="batch_size"):
        client.power_plan("resnet", 48)
    with pytest.raises(InvalidArgument, match="power_limit_w"):
        client.report_power_window("resnet", 64, 400.0, 10.0, 2000.0)
    with pytest.raises(FailedPrecondition, match="batch_size"):
        client.report_power_window("resnet", 128, 250.0, 10.0, 2000.0)


def test_power_calls_need_a_power_spec(daemon):
    _, client = daemon
    spec = zeus_spec()
    spec.ClearField("power")
    client.register_zeus_job(spec)
    with pytest.raises(FailedPrecondition, match="power spec"):
        client.power_plan("resnet", 64)


def test_delete_forgets_the_job_and_its_profiles(daemon):
    _, client = daemon
    client.register_zeus_job(zeus_spec())
    client.predict_batch_size("resnet")
    client.report_power_window("resnet", 64, 250.0, 10.0, 2500.0)
    assert client.power_plan("resnet", 64).power_limit_w == 200.0
    client.delete_zeus_job("resnet")
    with pytest.raises(NotFound):
        client.get_zeus_job("resnet")
    client.register_zeus_job(zeus_spec())
    client.predict_batch_size("resnet")
    assert client.power_plan("resnet", 64).power_limit_w == 250.0  # profile started afresh


def test_a_retried_delete_is_told_from_a_second_one(daemons):
    """DeleteJob with a request_id: a repeat gets the stored empty reply (the retry of a
    delete whose answer was lost), also after a restart, and does not delete the job
    registered again since; without an id or with another one, a second delete is NOT_FOUND."""
    srv, client = daemons.start()
    client.register_zeus_job(zeus_spec())
    client.delete_zeus_job("resnet", request_id="del-1")
    client.delete_zeus_job("resnet", request_id="del-1")  # a retry: answered, no NOT_FOUND
    for other in ("del-2", ""):
        with pytest.raises(NotFound, match="^job_id: "):
            client.delete_zeus_job("resnet", request_id=other)
    with pytest.raises(InvalidArgument, match="^request_id: "):
        client.delete_zeus_job("resnet", request_id="d" * 201)
    client.register_zeus_job(zeus_spec())
    daemons.stop(srv)
    srv, client = daemons.start()
    client.delete_zeus_job("resnet", request_id="del-1")  # the first delete's stored reply
    assert client.get_zeus_job("resnet").spec.job_id == "resnet"  # the new job is kept
    client.delete_zeus_job("resnet")  # a fresh id: deletes the new job
    with pytest.raises(NotFound):
        client.get_zeus_job("resnet")


def test_a_retried_power_window_is_recorded_once(daemons):
    """ReportWindow / InterruptWindow with a request_id: a repeat gets the first plan and
    records nothing more (one window, one interruption), also after a restart; the same id
    with other arguments is INVALID_ARGUMENT naming request_id and changes nothing; another
    id is a new call (the window it names is no longer the one being profiled)."""
    srv, client = daemons.start()
    client.register_zeus_job(zeus_spec())
    client.predict_batch_size("resnet")
    cut = client.interrupt_power_window("resnet", 64, 250.0, request_id="i1")
    assert client.interrupt_power_window("resnet", 64, 250.0, request_id="i1") == cut
    first = client.report_power_window("resnet", 64, 250.0, 10.0, 2500.0, request_id="w1")
    assert first.power_limit_w == 200.0
    assert client.report_power_window("resnet", 64, 250.0, 10.0, 2500.0,
                                      request_id="w1") == first
    profile = client.power_profile("resnet", 64)
    assert [m.power_limit_w for m in profile.measurements] == [250.0]
    for args in ((250.0, 11.0, 2500.0), (250.0, 10.0, 2400.0), (200.0, 10.0, 2500.0)):
        with pytest.raises(InvalidArgument, match="^request_id: was used for another "
                                                  "ReportWindow"):
            client.report_power_window("resnet", 64, *args, request_id="w1")
    with pytest.raises(InvalidArgument, match="^request_id: "):
        client.interrupt_power_window("resnet", 64, 200.0, request_id="i1")
    with pytest.raises(FailedPrecondition, match="^power_limit_w: "):
        client.report_power_window("resnet", 64, 250.0, 10.0, 2500.0, request_id="w2")
    with pytest.raises(InvalidArgument, match="^request_id: "):
        client.report_power_window("resnet", 64, 200.0, 10.0, 2000.0, request_id="w" * 201)
    assert client.power_profile("resnet", 64) == profile  # the refusals changed nothing
    daemons.stop(srv)
    srv, client = daemons.start()
    assert client.report_power_window("resnet", 64, 250.0, 10.0, 2500.0,
                                      request_id="w1") == first
    assert client.interrupt_power_window("resnet", 64, 250.0, request_id="i1") == cut
    assert client.power_profile("resnet", 64) == profile
    assert srv.zeus.profiles[("resnet", 64)].interruptions == 1  # (not in PowerProfile)
    state = json.loads(client.get_zeus_job("resnet").state_json)  # (the job is unchanged)
    assert state["trials"][0]["status"] == "running"
    # the same id for another batch size is another request (bound to job and batch size)
    client.report_epoch("resnet", 1, 1, 10.0, 2000.0, 0.8)
    client.end_trial("resnet", 1)
    other = client.predict_batch_size("resnet").batch_size
    assert other != 64
    assert client.report_power_window("resnet", other, 250.0, 10.0, 2500.0,
                                      request_id="w1").power_limit_w == 200.0


# ----------------------------------------------------------------------------- simulation
@needs_traces
def test_replay_zeus_on_the_recorded_traces(tmp_path):
    out = tmp_path / "zeus"
    result = CliRunner().invoke(app, [
        "replay", "zeus", "--train", str(DATA / "summary_train.csv"),
        "--power", str(DATA / "summary_power_v100.csv"), "--workload", "squad",
        "--recurrences", "12", "--eta", "0.5", "--beta", "2", "--seed", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    history = pd.read_csv(out / "history.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert list(history.columns[:8]) == ["recurrence", "try", "batch_size", "power_limit_w",
                                         "energy_j", "time_s", "reached", "cost"]
    assert history.loc[history.reached, "recurrence"].tolist() == list(range(1, 13))
    assert summary["energy_j"] == pytest.approx(history.energy_j.sum())
    assert summary["energy_saving"] == pytest.approx(
        1 - summary["energy_j"] / summary["baseline_energy_j"])
    assert (out / "history.png").stat().st_size > 10_000
    assert set(history.power_limit_w) <= {100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0}


def test_replay_zeus_bad_input_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(app, [
        "replay", "zeus", "--train", str(tmp_path / "missing.csv"), "--power",
        str(tmp_path / "p.csv"), "--workload", "squad", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "missing.csv: no such file" in result.output
    result = CliRunner().invoke(app, [
        "replay", "zeus", "--train", "a", "--power", "b", "--workload", "mnist"])
    assert result.exit_code == 2 and "unknown workload 'mnist'" in result.output


def test_simulated_run_that_cannot_afford_one_epoch_fails_without_a_history_row(daemon):
    """Zeus's simulator semantics: a batch size whose first epoch already crosses the cost
    bound never runs, and the optimizer learns that it failed (it must not be retried forever)."""
    from offcut.replay.zeus_sim import Workload, ZeusReplayOptions, simulate

    _, client = daemon
    w = Workload("toy", "net", "sgd", 0.9, True, default_batch_size=8, max_epochs=10)
    rows = []
    for bs, epoch_s, target in ((8, 10.0, 3), (16, 100.0, 2)):  # 16: one epoch costs > 2x a run of 8
        for run in (0, 1):
            for pl in (100.0, 150.0):
                rows.append(dict(dataset="toy", network="net", optimizer="sgd", target_metric=0.9,
                                 batch_size=bs, run=run, target_epoch=target, power_limit=pl,
                                 time_per_epoch=epoch_s * 150.0 / pl, average_power=pl * 0.8))
    df = pd.DataFrame(rows)
    df["energy_per_epoch"] = df.time_per_epoch * df.average_power
    history = simulate(client, df, w, ZeusReplayOptions(recurrences=4, beta_knob=2.0, seed=3),
                       "toy")
    assert [h["batch_size"] for h in history] == [8, 8, 8, 8]
    trials = client.get_zeus_job("toy").trials
    assert [(t.batch_size, t.status, t.epochs) for t in trials if t.batch_size == 16] == \
        [(16, "failed", 1)]  # tried once: round 2 prunes over round 1's survivors only


# ----------------------------------------------------------------------------- generations
def bso(client):
    """Raw calls with the fields the Client's helpers do not send; errors as offcut errors."""
    def call(rpc, **fields):
        request_cls = {"EndTrial": zeus_pb2.EndTrialRequest,
                       "ResumeTrial": zeus_pb2.ResumeTrialRequest,
                       "Predict": zeus_pb2.PredictRequest,
                       "ReportEpoch": zeus_pb2.ReportEpochRequest}[rpc]
        try:
            return getattr(client.bso, rpc)(request_cls(**fields), timeout=10)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
    return call


def prune_spec(**kw):
    """The user's report: batch sizes 16/32/64/128, default 64 (no early stopping)."""
    fields = dict(job_id="gen", batch_sizes=[16, 32, 64, 128], default_batch_size=64,
                  beta_knob=None, target_metric=0.7)
    fields.update(kw)
    return zeus_spec(**fields)


def test_an_interrupted_end_trial_keeps_every_arm(daemon):
    """Reproduction: one reported epoch, then EndTrial (what a preempted run sent) pruned 16,
    32 and 64 for good; EndTrial with interrupted suspends the trial instead."""
    _, client = daemon
    call = bso(client)
    client.register_zeus_job(prune_spec(num_pruning_rounds=1))
    pred = client.predict_batch_size("gen")
    assert pred.batch_size == 64
    client.report_epoch("gen", pred.trial_number, 1, 10.0, 2000.0, 0.1)
    verdict = call("EndTrial", job_id="gen", trial_number=pred.trial_number, interrupted=True,
                   time_s=14.0, energy_j=2800.0)
    assert verdict.suspended and not verdict.finished
    assert verdict.cost_j == pytest.approx(zeus_cost(2800.0, 14.0, 0.5, 250.0))
    resumed = call("ResumeTrial", job_id="gen", trial_number=pred.trial_number)
    assert (resumed.epochs, resumed.time_s, resumed.energy_j) == (1, 14.0, 2800.0)
    verdict = client.report_epoch("gen", pred.trial_number, 2, 24.0, 4800.0, 0.8)
    assert verdict.converged
    while job_state(client, "gen")["phase"] == "pruning":
        run_trial(client, "gen", converge_at=2)
    assert job_state(client, "gen")["arms"] == [16, 32, 64, 128]
    trial = client.get_zeus_job("gen").trials[0]
    assert (trial.status, trial.epochs, trial.interruptions) == ("converged", 2, 1)


def _suspended(client, **spec_kw):
    """A job with trial 1 (epoch 1 reported, generation 1) suspended, and trial 2 converged."""
    call = bso(client)
    client.register_zeus_job(prune_spec(**spec_kw))
    p1 = call("Predict", job_id="gen", generation=1)
    call("ReportEpoch", job_id="gen", trial_number=p1.trial_number, epoch=1, time_s=10.0,
         energy_j=2000.0, metric=0.1, generation=1)
    call("EndTrial", job_id="gen", trial_number=p1.trial_number, interrupted=True, time_s=12.0,
         energy_j=2400.0, generation=1)
    p2 = client.predict_batch_size("gen")
    client.report_epoch("gen", p2.trial_number, 1, 10.0, 2000.0, 0.9)
    return call


@pytest.mark.parametrize("rpc, fields, error, field", [
    # EndTrial's new fields
    ("EndTrial", dict(trial_number=1, interrupted=True, time_s=math.nan), InvalidArgument,
     "time_s"),
    ("EndTrial", dict(trial_number=1, interrupted=True, time_s=-1.0), InvalidArgument, "time_s"),
    ("EndTrial", dict(trial_number=1, interrupted=True, energy_j=math.inf), InvalidArgument,
     "energy_j"),
    ("EndTrial", dict(trial_number=1, interrupted=True, time_s=1e300), InvalidArgument,
     "time_s"),
    ("EndTrial", dict(trial_number=1, interrupted=True, time_s=11.0), FailedPrecondition,
     "time_s"),
    ("EndTrial", dict(trial_number=1, interrupted=True, energy_j=1.0), FailedPrecondition,
     "energy_j"),
    ("EndTrial", dict(trial_number=1, time_s=20.0), InvalidArgument, "time_s"),
    ("EndTrial", dict(trial_number=1, interrupted=True, generation=2**63), InvalidArgument,
     "generation"),
    ("EndTrial", dict(trial_number=1, interrupted=True, generation=2**64 - 1), InvalidArgument,
     "generation"),
    ("EndTrial", dict(trial_number=1, generation=2), FailedPrecondition, "generation"),
    ("EndTrial", dict(trial_number=99, interrupted=True), NotFound, "trial_number"),
    ("EndTrial", dict(trial_number=-2**31, interrupted=True), NotFound, "trial_number"),
    # ResumeTrial
    ("ResumeTrial", dict(trial_number=99), NotFound, "trial_number"),
    ("ResumeTrial", dict(trial_number=0), NotFound, "trial_number"),
    ("ResumeTrial", dict(trial_number=2), FailedPrecondition, "trial_number"),   # closed
    ("ResumeTrial", dict(trial_number=1, generation=2**63), InvalidArgument, "generation"),
    ("ResumeTrial", dict(trial_number=1, request_id="r" * 201), InvalidArgument, "request_id"),
    ("ResumeTrial", dict(job_id="", trial_number=1), InvalidArgument, "job_id"),
    ("ResumeTrial", dict(job_id="nope", trial_number=1), NotFound, "job_id"),
    # the generation of Predict and ReportEpoch
    ("Predict", dict(generation=2**63), InvalidArgument, "generation"),
    ("ReportEpoch", dict(trial_number=1, epoch=2, time_s=20.0, energy_j=4000.0, metric=0.1),
     FailedPrecondition, "trial_number"),                                       # suspended
    ("ReportEpoch", dict(trial_number=2, epoch=2, time_s=20.0, energy_j=4000.0, metric=0.1,
                         generation=2**63), InvalidArgument, "generation"),
])
def test_hostile_values_of_the_new_fields_are_refused_and_change_nothing(daemon, rpc, fields,
                                                                         error, field):
    _, client = daemon
    call = _suspended(client)
    before = client.get_zeus_job("gen").state_json
    with pytest.raises(error, match=f"^{field}: "):
        call(rpc, **{"job_id": "gen", **fields})
    assert client.get_zeus_job("gen").state_json == before


def test_two_concurrent_resumes_get_the_trial_once_and_a_retry_gets_the_same_answer(daemon):
    _, client = daemon
    call = _suspended(client)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def resume(request_id):
        barrier.wait(timeout=10)
        try:
            outcomes[request_id] = call("ResumeTrial", job_id="gen", trial_number=1,
                                        request_id=request_id, generation=2)
        except FailedPrecondition as exc:
            outcomes[request_id] = exc

    threads = [threading.Thread(target=resume, args=(r,)) for r in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    won = [r for r, o in outcomes.items() if isinstance(o, zeus_pb2.ResumedTrial)]
    lost = [r for r, o in outcomes.items() if isinstance(o, FailedPrecondition)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert str(outcomes[lost[0]]).startswith("trial_number: trial 1 is running, held by "
                                             "generation 2")
    first = outcomes[won[0]]
    assert (first.epochs, first.time_s, first.energy_j, first.generation) == (1, 12.0, 2400.0, 2)
    before = client.get_zeus_job("gen").state_json
    again = call("ResumeTrial", job_id="gen", trial_number=1, request_id=won[0], generation=2)
    assert again == first and client.get_zeus_job("gen").state_json == before  # replayed
    with pytest.raises(FailedPrecondition, match="^generation: .*replaced"):  # generation 1
        call("ReportEpoch", job_id="gen", trial_number=1, epoch=2, time_s=20.0,
             energy_j=4000.0, metric=0.1, generation=1)
    call("EndTrial", job_id="gen", trial_number=1, interrupted=True, generation=2)
    with pytest.raises(FailedPrecondition, match="^generation: .*older"):
        call("ResumeTrial", job_id="gen", trial_number=1, generation=1)
    # generation 3 resumes it; killed without grace, generation 4 takes it over
    assert not call("ResumeTrial", job_id="gen", trial_number=1, generation=3).taken_over
    taken = call("ResumeTrial", job_id="gen", trial_number=1, generation=4)
    assert taken.taken_over and taken.generation == 4
    trial = client.get_zeus_job("gen").trials[0]
    assert (trial.status, trial.generation, trial.interruptions) == ("running", 4, 3)


def test_a_suspended_trial_survives_a_restart_and_goes_on(daemons):
    srv, client = daemons.start()
    _suspended(client)
    daemons.stop(srv)
    srv, client = daemons.start()
    assert client.get_zeus_job("gen").trials[0].status == "suspended"
    resumed = bso(client)("ResumeTrial", job_id="gen", trial_number=1, generation=2)
    assert (resumed.epochs, resumed.time_s, resumed.energy_j) == (1, 12.0, 2400.0)


def test_a_stale_suspended_trial_is_abandoned_by_the_next_predict(daemon):
    """The abandoned-trial rule: with suspended_trial_timeout_s 0 a suspended trial is stale at
    once; the next Predict ends it without a verdict and plans its pruning step again. (With
    the default of a day, the Predict in ``_suspended`` leaves trial 1 suspended.)"""
    _, client = daemon
    call = bso(client)
    client.register_zeus_job(prune_spec(suspended_trial_timeout_s=0.0))
    assert client.get_zeus_job("gen").spec.suspended_trial_timeout_s == 0.0
    p1 = client.predict_batch_size("gen")
    client.report_epoch("gen", p1.trial_number, 1, 10.0, 2000.0, 0.1)
    call("EndTrial", job_id="gen", trial_number=p1.trial_number, interrupted=True)
    p2 = client.predict_batch_size("gen")
    trial = client.get_zeus_job("gen").trials[0]
    assert (trial.status, trial.epochs) == ("abandoned", 1)
    assert (p2.batch_size, p2.exploration) == (p1.batch_size, True)  # planned again
    assert job_state(client, "gen")["min_cost_j"] is None             # no verdict on 64
    with pytest.raises(FailedPrecondition, match="^trial_number: .*abandoned"):
        call("ResumeTrial", job_id="gen", trial_number=p1.trial_number, generation=2)


@pytest.mark.parametrize("value", [math.nan, -1.0, math.inf, 1e10])
def test_a_bad_suspended_trial_timeout_is_refused(daemon, value):
    _, client = daemon
    with pytest.raises(InvalidArgument, match=r"^spec\.suspended_trial_timeout_s: "):
        client.register_zeus_job(prune_spec(suspended_trial_timeout_s=value))
    with pytest.raises(NotFound):
        client.get_zeus_job("gen")


# ----------------------------------------------------------------------------- owners
# With tokens a Zeus job belongs to the user who registered it (docs/zeus.md,
# "Owners and request ids"): another user's job is NOT_FOUND, admins act on all, request ids are
# bound to their caller, method and job. The tokens are made as tests/test_auth.py makes them.


@pytest.fixture
def secured(daemons, user_tokens):
    return start_secured(daemons, user_tokens)


def job_view(job: ZeusJob):
    """A ZeusJob with its ``state_json`` parsed (a restart may order its keys otherwise)."""
    return job.owner, job.spec, job.power, job.phase, list(job.trials), json.loads(job.state_json)


def power_calls(client, job_id, batch_size):
    """Every PowerLimitOptimizer call on ``(job_id, batch_size)``, each a thunk."""
    return [lambda: client.power_plan(job_id, batch_size),
            lambda: client.report_power_window(job_id, batch_size, 250.0, 10.0, 2500.0),
            lambda: client.interrupt_power_window(job_id, batch_size, 250.0),
            lambda: client.power_profile(job_id, batch_size)]


def test_a_user_cannot_touch_another_users_job_and_it_keeps_working(secured):
    _, c = secured
    alice, mallory = c["alice"], c["mallory"]
    assert alice.register_zeus_job(prune_spec(job_id="a-job")).owner == "alice"
    assert mallory.register_zeus_job(prune_spec(job_id="m-job")).owner == "mallory"
    first = alice.predict_batch_size("a-job", request_id="r1")
    alice.report_epoch("a-job", first.trial_number, 1, 10.0, 2000.0, 0.1)
    bso(alice)("EndTrial", job_id="a-job", trial_number=first.trial_number, interrupted=True)
    alice.report_power_window("a-job", first.batch_size, 250.0, 10.0, 2500.0)
    before = alice.get_zeus_job("a-job")
    profile_before = alice.power_profile("a-job", first.batch_size)

    call = bso(mallory)
    attempts = [
        lambda: mallory.get_zeus_job("a-job"),
        lambda: mallory.predict_batch_size("a-job"),
        lambda: mallory.predict_batch_size("a-job", request_id="r1"),  # alice's request id
        lambda: call("ReportEpoch", job_id="a-job", trial_number=first.trial_number, epoch=2,
                     time_s=1.0, energy_j=1.0, metric=0.99),
        lambda: call("EndTrial", job_id="a-job", trial_number=first.trial_number),
        lambda: call("ResumeTrial", job_id="a-job", trial_number=first.trial_number,
                     generation=9),
        lambda: call("ResumeTrial", job_id="a-job", trial_number=first.trial_number,
                     request_id="r1"),
        lambda: mallory.delete_zeus_job("a-job"),
        *power_calls(mallory, "a-job", first.batch_size),
    ]
    for attempt in attempts:
        with pytest.raises(NotFound, match="^job_id: no Zeus job 'a-job'$"):  # as if unknown
            attempt()
    # her job id and her request id get mallory nothing of alice's
    with pytest.raises(AlreadyExists, match="^spec.job_id: .*another user") as info:
        mallory.register_zeus_job(prune_spec(job_id="a-job"))
    assert "alice" not in str(info.value)
    with pytest.raises(PermissionDenied, match="^owner: "):
        mallory.register_zeus_job(prune_spec(job_id="a-job"), owner="alice")
    own = mallory.predict_batch_size("m-job", request_id="r1")
    assert own.trial_number == 1 and len(mallory.get_zeus_job("m-job").trials) == 1

    after = alice.get_zeus_job("a-job")
    assert after == before  # spec, owner, trials, state_json: unchanged
    assert alice.power_profile("a-job", first.batch_size) == profile_before
    # alice's job goes on: her retry gets her answer, her trial resumes, a new one opens
    again = alice.predict_batch_size("a-job", request_id="r1")
    assert (again.trial_number, again.batch_size) == (first.trial_number, first.batch_size)
    resumed = bso(alice)("ResumeTrial", job_id="a-job", trial_number=first.trial_number,
                         request_id="r1")
    assert (resumed.epochs, resumed.time_s) == (1, 10.0)
    assert alice.report_epoch("a-job", first.trial_number, 2, 20.0, 4000.0, 0.8).converged
    assert alice.predict_batch_size("a-job").trial_number == first.trial_number + 1
    alice.delete_zeus_job("a-job")
    with pytest.raises(NotFound):
        alice.get_zeus_job("a-job")


def test_a_request_id_is_bound_to_its_caller_and_job(secured):
    """The same request id from another caller (an admin) or for another job is a new
    request: it never gets the first answer; for the same caller, job and method it does."""
    _, c = secured
    alice, admin = c["alice"], c["admin"]
    for job_id in ("a-one", "a-two"):
        alice.register_zeus_job(prune_spec(job_id=job_id))
    first = alice.predict_batch_size("a-one", request_id="shared")
    other_job = alice.predict_batch_size("a-two", request_id="shared")
    by_admin = admin.predict_batch_size("a-one", request_id="shared")
    assert (first.trial_number, other_job.trial_number, by_admin.trial_number) == (1, 1, 2)
    assert [len(alice.get_zeus_job(j).trials) for j in ("a-one", "a-two")] == [2, 1]
    assert alice.predict_batch_size("a-one", request_id="shared") == first
    assert admin.predict_batch_size("a-one", request_id="shared") == by_admin
    # ResumeTrial: the same id for another trial, or from another caller, resumes afresh
    call, admin_call = bso(alice), bso(admin)
    for t in (1, 2):
        call("EndTrial", job_id="a-one", trial_number=t, interrupted=True)
    one = call("ResumeTrial", job_id="a-one", trial_number=1, request_id="res", generation=2)
    two = call("ResumeTrial", job_id="a-one", trial_number=2, request_id="res", generation=2)
    assert (one.trial_number, two.trial_number) == (1, 2)
    assert call("ResumeTrial", job_id="a-one", trial_number=1, request_id="res",
                generation=2) == one
    taken = admin_call("ResumeTrial", job_id="a-one", trial_number=1, request_id="res",
                       generation=3)
    assert taken.taken_over and taken.generation == 3


def test_admins_see_and_act_on_every_job_and_owners_survive_a_restart(daemons, user_tokens):
    srv, c = start_secured(daemons, user_tokens)
    c["alice"].register_zeus_job(prune_spec(job_id="a-job"))
    c["mallory"].register_zeus_job(prune_spec(job_id="m-job"))
    c["admin"].register_zeus_job(prune_spec(job_id="for-alice"), owner="alice")
    pred = c["alice"].predict_batch_size("a-job", request_id="r1")
    admin = c["admin"]
    assert {j: admin.get_zeus_job(j).owner for j in ("a-job", "m-job", "for-alice")} == \
        {"a-job": "alice", "m-job": "mallory", "for-alice": "alice"}
    admin.report_epoch("a-job", pred.trial_number, 1, 10.0, 2000.0, 0.1)
    assert admin.power_plan("a-job", pred.batch_size).action == "profile"
    admin.predict_batch_size("m-job")
    with pytest.raises(AlreadyExists, match="^owner: .*'alice'"):  # owned: not handed over
        admin.register_zeus_job(prune_spec(job_id="a-job"), owner="mallory")
    assert c["alice"].get_zeus_job("for-alice").owner == "alice"
    before = {j: job_view(admin.get_zeus_job(j)) for j in ("a-job", "m-job", "for-alice")}

    daemons.stop(srv)
    srv, c = start_secured(daemons, user_tokens)
    assert {j: job_view(c["admin"].get_zeus_job(j)) for j in before} == before
    for job_id in ("a-job", "for-alice"):
        with pytest.raises(NotFound):
            c["mallory"].get_zeus_job(job_id)
    with pytest.raises(NotFound):
        c["alice"].get_zeus_job("m-job")
    assert c["alice"].predict_batch_size("a-job", request_id="r1") == pred  # still bound
    assert c["mallory"].get_zeus_job("m-job").owner == "mallory"
    c["admin"].delete_zeus_job("m-job")
    with pytest.raises(NotFound):
        c["mallory"].get_zeus_job("m-job")


def test_jobs_without_an_owner_are_admin_only_until_handed_to_a_user(daemons, user_tokens):
    """A job registered on a daemon without tokens has no owner; once tokens are on, it is
    admin-only, and an admin gives it to its user by registering its identical spec with
    ``owner``, its trials kept."""
    srv, local = daemons.start("sec")
    assert local.register_zeus_job(prune_spec()).owner == ""
    local.predict_batch_size("gen", request_id="r1")
    daemons.stop(srv)
    srv, c = start_secured(daemons, user_tokens)
    for user in ("alice", "mallory"):
        with pytest.raises(NotFound):
            c[user].predict_batch_size("gen")
        with pytest.raises(AlreadyExists, match="^spec.job_id: "):
            c[user].register_zeus_job(prune_spec())
    assert c["admin"].register_zeus_job(prune_spec()).owner == ""  # idempotent, unchanged
    with pytest.raises(AlreadyExists, match="^spec.job_id: .*different spec"):
        c["admin"].register_zeus_job(prune_spec(max_epochs=5), owner="alice")
    handed = c["admin"].register_zeus_job(prune_spec(), owner="alice")
    assert handed.owner == "alice" and len(handed.trials) == 1
    assert c["alice"].get_zeus_job("gen") == handed
    assert c["alice"].predict_batch_size("gen").trial_number == 2
    with pytest.raises(NotFound):
        c["mallory"].get_zeus_job("gen")
