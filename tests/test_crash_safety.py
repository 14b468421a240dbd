"""Crash safety (issue 5 item 1, docs/architecture.md, "Recovery"): ``kill -9`` of a daemon process
at seeded points of a replay and of a recurring Zeus job, restart on the same state file and
socket, and the outputs equal an uninterrupted run's. The harness is
``benchmarks/crash_safety.py`` (its full size: 128 real nodes, 10 tasks, 300 events, 20 kills);
here the bundled demo log, so this runs without ../shared. Also the client's retry policy on its
own."""

from __future__ import annotations


import grpc
import pytest

from offcut.client import Client
from offcut.client.retry import ALWAYS, NEVER, RECONCILED, WITH_REQUEST_ID, RetryPolicy, retryable
from offcut.errors import FailedPrecondition, NotFound, Unavailable
from offcut.replay.driver import ReplayOptions

from daemon_helpers import Clock, load_benchmark, zeus_spec


def _harness():
    return load_benchmark("crash_safety")


# ----------------------------------------------------------------------------- retry policy
class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


def _client(policy: RetryPolicy) -> Client:
    return Client("unix:///nonexistent/offcut-test.sock", timeout_s=1, retry=policy)


def test_policy_backoff_is_capped_and_the_deadline_ends_retries():
    clock = Clock()
    policy = RetryPolicy(deadline_s=5.0, initial_backoff_s=0.1, max_backoff_s=1.0, jitter=0.0,
                         sleep=clock.sleep, clock=clock)
    calls = []

    def fails(self, time, source, seq, *, idle=(), preempted=()):
        calls.append(seq)
        raise _Unavailable()

    fails.__name__ = "report_nodes"
    with _client(policy) as c, pytest.raises(Unavailable, match="cannot reach offcutd"):
        policy.call(c, fails, (1.0, "w", 3), {"idle": ["n1"]})
    assert clock.waits[:5] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    assert max(clock.waits) == 1.0 and sum(clock.waits) <= 5.0
    assert len(calls) == len(clock.waits) + 1 == policy.retries + 1
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff_s=2.0, max_backoff_s=1.0)


def test_policy_retries_only_calls_that_cannot_apply_twice():
    assert retryable("report_nodes", {}) and retryable("status", {})
    assert retryable("submit", {"request_id": "r1"}) and not retryable("submit", {"request_id": ""})
    assert retryable("predict_batch_size", {"request_id": "x"})
    assert not retryable("predict_batch_size", {"request_id": ""})
    assert not any(retryable(n, {"request_id": "r"}) for n in NEVER)
    assert retryable("cancel", {"request_id": "c1"}) and not retryable("cancel", {})
    assert not (ALWAYS | WITH_REQUEST_ID | RECONCILED) & NEVER
    clock = Clock()
    policy = RetryPolicy(deadline_s=5.0, sleep=clock.sleep, clock=clock)
    n = 0

    def cancel(self, task_id, time=None):
        nonlocal n
        n += 1
        raise _Unavailable()

    with _client(policy) as c, pytest.raises(Unavailable):
        policy.call(c, cancel, ("t1",), {})
    assert n == 1 and clock.waits == []  # no request id, not idempotent: raised at once


def test_every_client_call_has_a_retry_rule():
    public = {name for name, fn in vars(Client).items()
              if callable(fn) and not name.startswith("_") and hasattr(fn, "__wrapped__")}
    assert public == ALWAYS | WITH_REQUEST_ID | RECONCILED | NEVER


def test_a_repeated_report_epoch_whose_first_attempt_was_applied_is_keep_training(daemons):
    _, c = daemons.start()
    c.register_zeus_job(zeus_spec())
    trial = c.predict_batch_size("resnet", request_id="p1").trial_number
    first = c.report_epoch("resnet", trial, 1, 10.0, 2000.0, 0.1)
    assert not first.stop
    clock = Clock()
    policy = RetryPolicy(sleep=clock.sleep, clock=clock)
    attempts = 0

    def report_epoch(self, job_id, trial_number, epoch, time_s, energy_j, metric, batch_size=0):
        nonlocal attempts
        attempts += 1
        if attempts == 1:  # applied before the daemon went away; the reply was lost
            raise _Unavailable()
        return Client.report_epoch.__wrapped__(self, job_id, trial_number, epoch, time_s,
                                               energy_j, metric, batch_size)

    c.retry = policy
    again = policy.call(c, report_epoch, ("resnet", trial, 1, 10.0, 2000.0, 0.1), {})
    assert (again.stop, again.converged, again.finished) == (False, False, False)
    assert again.cost_j == pytest.approx(first.cost_j) and again.message == first.message
    attempts = 0  # different figures for an applied epoch are still refused
    with pytest.raises(FailedPrecondition, match="epoch"):
        policy.call(c, report_epoch, ("resnet", trial, 1, 11.0, 2000.0, 0.1), {})
    c.retry = None


class _LosesFirstReply:
    """A stub whose calls reach the daemon, but the first reply of each method with a
    request id is lost (UNAVAILABLE, as when the daemon restarts after applying it); records
    the request ids."""

    def __init__(self, stub):
        self.stub, self.ids, self.lost = stub, [], set()

    def __getattr__(self, rpc):
        def call(request, timeout=None):
            reply = getattr(self.stub, rpc)(request, timeout=timeout)
            if "request_id" not in type(request).DESCRIPTOR.fields_by_name:
                return reply  # (reads)
            self.ids.append((rpc, request.request_id))
            if rpc not in self.lost:
                self.lost.add(rpc)
                raise _Unavailable()
            return reply
        return call


def test_delete_and_power_windows_are_retried_with_one_fresh_id_per_call(daemons):
    """The Client gives DeleteJob, ReportWindow and InterruptWindow a fresh request id per
    call and sends it again on each retry: a call whose first reply was lost is applied once
    and answered as the first time (no NOT_FOUND, no second window or interruption)."""
    srv, c = daemons.start()
    c.register_zeus_job(zeus_spec())
    c.predict_batch_size("resnet")
    clock = Clock()
    c.retry = RetryPolicy(sleep=clock.sleep, clock=clock)
    c.plo = _LosesFirstReply(c.plo)
    assert c.interrupt_power_window("resnet", 64, 250.0).power_limit_w == 250.0
    assert c.report_power_window("resnet", 64, 250.0, 10.0, 2500.0).power_limit_w == 200.0
    assert c.report_power_window("resnet", 64, 200.0, 10.5, 2000.0).power_limit_w == 150.0
    assert [m.power_limit_w for m in c.power_profile("resnet", 64).measurements] == [250.0,
                                                                                     200.0]
    assert srv.zeus.profiles[("resnet", 64)].interruptions == 1
    c.bso = _LosesFirstReply(c.bso)
    c.delete_zeus_job("resnet")
    ids = c.plo.ids + c.bso.ids
    assert [rpc for rpc, _ in ids] == ["InterruptWindow"] * 2 + ["ReportWindow"] * 3 + [
        "DeleteJob"] * 2
    assert ids[0][1] == ids[1][1] and ids[2][1] == ids[3][1] and ids[5][1] == ids[6][1]
    assert len({i for _, i in ids}) == 4 and all(i for _, i in ids)  # fresh per call
    assert c.retry.retries == 3
    c.retry = None
    with pytest.raises(NotFound):  # deleted once: a second call (a fresh id) finds nothing
        c.delete_zeus_job("resnet")


# ----------------------------------------------------------------------------- kill -9
@pytest.mark.slow
def test_kill_9_at_seeded_points_changes_nothing(tmp_path):
    """Demo log (64 nodes, 6 tasks) to 500 events, 8 kills in the replay (each kind: after an
    acknowledged call, applied with the reply lost, in flight to a stopped daemon, with the
    driver; two of them at submissions) and 3 in a 6-recurrence Zeus job (at ReportEpoch and
    Predict); everything equals the uninterrupted run."""
    h = _harness()
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.synth import demo_data_dir

    data = demo_data_dir()
    opts = ReplayOptions(solver="dp", max_events=500, progress=False)
    ref, crash, problems = h.crash_test(load_node_log(data, skip_rows=0), load_task_set(data),
                                        opts, tmp_path, replay_kills=8, zeus_kills=3,
                                        recurrences=6, seed=5)
    assert problems == []
    assert {p.kind for p, _ in crash.fired} == set(h.REPLAY_KINDS)
    assert len(crash.fired) == 11 and crash.kills >= 11
    assert crash.driver_restarts == sum(p.kind == "driver" for p, _ in crash.fired) >= 1
    assert crash.retries > 0
    # the comparison is not vacuous: the replay did work and the Zeus job ran every trial
    assert ref.summary["events"] == 500 and ref.summary["total_samples"] > 0
    assert len(ref.view["zeus"][1]["trials"]) == 6
    assert ref.summary == {**crash.summary, **{k: ref.summary[k] for k in h.TIMING_FIELDS}}
    fired = {(p.kind, p.call) for p, _ in crash.fired}
    assert {("lost-reply", "SubmitTask"), ("in-flight", "SubmitTask"),
            ("lost-reply", "ReportEpoch"), ("lost-reply", "Predict")} <= fired
    assert crash.reconciled == 1  # the lost "keep training" answer of that ReportEpoch
    # and the comparison does see a duplicated row or a journal entry applied twice
    steps = (crash.out / "steps.csv").read_text().splitlines(keepends=True)
    (crash.out / "steps.csv").write_text("".join(steps[:100] + steps[99:]))
    assert any("steps.csv" in p for p in h.compare_runs(ref, crash))
    twice = dict(crash.view, journal=crash.view["journal"][:50] + crash.view["journal"][49:])
    assert h.check_journal(twice, "replay", crash.summary["tasks_submitted"])


def test_driver_without_retries_resumes_from_what_the_daemon_applied(tmp_path):
    """A client without a retry policy: every kill reaches the driver as Unavailable, and the
    driver (``resume_wait_s``) waits for the restarted daemon, asks it what it applied
    (``last_seq``), fills its rows from the journal and continues."""
    h = _harness()
    from offcut.replay.bftrainer_data import load_node_log, load_task_set
    from offcut.replay.driver import run_replay
    from offcut.replay.synth import demo_data_dir

    data = demo_data_dir()
    log, tasks = load_node_log(data, skip_rows=0), load_task_set(data)
    opts = ReplayOptions(solver="dp", max_events=150, progress=False)
    outs = {}
    for name, points in (("ref", []), ("crash", [h.KillPoint(20, "lost-reply"),
                                                  h.KillPoint(60, "ack"),
                                                  h.KillPoint(100, "in-flight")])):
        sup = h.Supervisor(tmp_path, opts, f"{name}.sqlite")
        hook = h.KillHook(sup, points)
        sup.start()
        try:
            run_opts = ReplayOptions(**{**opts.__dict__, "target": sup.address})
            outs[name] = run_replay(log, tasks, tmp_path / name, run_opts, source="replay",
                                    resume_wait_s=30,
                                    connect=lambda a: hook.wrap(Client(a, timeout_s=20)))
            assert len(hook.fired) == len(points)
        finally:
            sup.stop()
    drop = lambda s: {k: v for k, v in s.items() if k not in h.TIMING_FIELDS}  # noqa: E731
    assert drop(outs["ref"]) == drop(outs["crash"])
    assert (h._steps_without_solve_ms(tmp_path / "ref" / "steps.csv")
            == h._steps_without_solve_ms(tmp_path / "crash" / "steps.csv"))
    assert ((tmp_path / "ref" / "placements.csv").read_bytes()
            == (tmp_path / "crash" / "placements.csv").read_bytes())
