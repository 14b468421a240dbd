"""The Zeus optimizers' domain logic without gRPC (docs/zeus.md, "The batch-size optimizer"):
pruning order, min_cost from converged runs only, concurrent submissions, Thompson sampling,
windowing, persistence, and the power-limit optimizer driven by Zeus's recorded profiling runs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from offcut.daemon.zeus.bso import BatchSizeJob
from offcut.daemon.zeus.plo import PowerLimitProfile
from offcut.zeus_views import PowerLimitSpec
from offcut.errors import FailedPrecondition, InvalidArgument, NotFound

from daemon_helpers import zeus_core_spec as spec

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "zeus-power-profiles"
needs_profiles = pytest.mark.skipif(
    not PROFILES.is_dir(), reason=f"recorded power profiles not found at {PROFILES} "
    "(../shared/data/zeus-power-profiles is not part of the repository)")


def finish(job: BatchSizeJob, trial: int, cost: float, converged: bool):
    """Report one epoch whose cost is ``cost`` (time only, eta 0.5: cost = 150 * time)."""
    return job.report(trial, job.spec.max_epochs if not converged else 1,
                      cost / ((1 - job.spec.eta_knob) * job.spec.max_power_w), 0.0,
                      1.0 if converged else 0.0)


def run(job: BatchSizeJob, outcome) -> int:
    """Predict, then finish the trial with ``outcome(batch_size) -> (cost, converged)``."""
    p = job.predict()
    cost, converged = outcome(p.batch_size)
    finish(job, p.trial_number, cost, converged)
    return p.batch_size


# ----------------------------------------------------------------------------- pruning
def test_pruning_walks_down_then_up_and_restarts_from_the_cheapest():
    job = BatchSizeJob(spec())
    # 8 fails; among the others 64 is cheapest
    costs = {16: 500.0, 32: 400.0, 64: 300.0, 128: 350.0}
    outcome = lambda b: (costs.get(b, 900.0), b in costs)  # noqa: E731
    order = [run(job, outcome) for _ in range(8)]
    # round 1 from b0 = 32: down 32, 16, 8 (fails: direction ends), up 64, 128
    # round 2 over the survivors [16, 32, 64, 128] from the cheapest, 64: down 64, 32, 16; up 128
    assert order[:5] == [32, 16, 8, 64, 128]
    assert order[5:] + [run(job, outcome)] == [64, 32, 16, 128]
    assert job.phase == "mab" and job.arms == [16, 32, 64, 128]
    assert job.best_batch_size == 64 and job.min_cost == pytest.approx(300.0)


def test_a_failing_default_goes_straight_to_larger_sizes():
    job = BatchSizeJob(spec(num_pruning_rounds=1))
    outcome = lambda b: (100.0 * b, b >= 64)  # noqa: E731
    assert [run(job, outcome) for _ in range(3)] == [32, 64, 128]
    assert job.arms == [64, 128]


def test_min_cost_comes_only_from_converged_runs():
    job = BatchSizeJob(spec(beta_knob=2.0))
    p = job.predict()
    assert p.cost_bound_j == math.inf
    finish(job, p.trial_number, 10.0, converged=False)  # cheap but failed
    assert job.min_cost is None and job.cost_bound() == math.inf
    p = job.predict()
    finish(job, p.trial_number, 400.0, converged=True)
    assert job.predict().cost_bound_j == pytest.approx(800.0)


def test_a_run_over_the_cost_bound_is_stopped_and_does_not_converge():
    job = BatchSizeJob(spec(beta_knob=2.0))
    p = job.predict()
    finish(job, p.trial_number, 100.0, converged=True)  # min_cost 100, bound 200
    p = job.predict()
    t = 1.0 / 150.0  # seconds per 1 J of cost
    assert not job.report(p.trial_number, 1, 150 * t, 0.0, 0.0).stop  # cost 150: go on
    verdict = job.report(p.trial_number, 2, 250 * t, 0.0, 1.0)  # reached, but cost 250 > 200
    assert verdict.stop and not verdict.converged and "exceeded" in verdict.message
    assert job.trials[-1]["status"] == "failed"


def test_concurrent_submissions_get_the_best_size_and_do_not_advance_pruning():
    job = BatchSizeJob(spec())
    first = job.predict()
    finish(job, first.trial_number, 400.0, True)  # 32 converged: best so far
    exploring = job.predict()  # pruning's next: 16
    concurrent = job.predict()
    assert (exploring.batch_size, exploring.exploration) == (16, True)
    assert (concurrent.batch_size, concurrent.exploration) == (32, False)
    finish(job, concurrent.trial_number, 50.0, False)  # finishes first; must not count for 16
    assert job.predict().batch_size == 32  # exploration of 16 still in flight
    finish(job, exploring.trial_number, 380.0, True)
    assert job.predict().batch_size == 8  # pruning goes on where it was


def test_an_abandoned_pruning_run_is_planned_again():
    job = BatchSizeJob(spec())
    p = job.predict()
    verdict = job.end_trial(p.trial_number)
    assert verdict.finished and job.trials[0]["status"] == "abandoned"
    again = job.predict()
    assert (again.batch_size, again.exploration) == (32, True)
    assert job.observations == []


def test_end_trial_after_epochs_counts_as_not_converged():
    job = BatchSizeJob(spec(num_pruning_rounds=1))
    p = job.predict()
    job.report(p.trial_number, 1, 1.0, 10.0, 0.0)
    verdict = job.end_trial(p.trial_number)
    assert verdict.finished and not verdict.converged
    assert job.observations == [(32, pytest.approx(-verdict.cost_j))]
    assert job.predict().batch_size == 64  # the failed default ended the downward walk
    assert job.end_trial(p.trial_number) == job._stored_verdict(job.trials[0])


def test_every_size_failing_is_a_failed_precondition_that_changes_nothing():
    job = BatchSizeJob(spec(num_pruning_rounds=1))
    for _ in range(2):  # 32 fails (down ends), 64 fails (up ends)
        run(job, lambda b: (100.0, False))
    before = job.to_dict()
    with pytest.raises(FailedPrecondition, match="job_id"):
        job.predict()
    assert job.to_dict() == before


# ----------------------------------------------------------------------------- Thompson sampling
def _through_pruning(job, costs):
    while job.phase == "pruning":
        run(job, lambda b: (costs[b], True))


def test_thompson_sampling_prefers_the_cheaper_arm_and_explores_with_variance():
    job = BatchSizeJob(spec(batch_sizes=(32, 64), default_batch_size=32, seed=11))
    rng = np.random.default_rng(0)
    cost = {32: 1000.0, 64: 700.0}
    noisy = lambda b: (cost[b] * (1 + 0.05 * rng.standard_normal()), True)  # noqa: E731
    _through_pruning(job, {32: 1010.0, 64: 690.0})
    picks = [run(job, noisy) for _ in range(40)]
    assert picks.count(64) > 30  # 30 % cheaper with 5 % noise: exploited
    assert job.arms == [32, 64]


def _gaussian_ts_reference(job: BatchSizeJob, rng: np.random.Generator) -> int:
    """Zeus's ``GaussianTS.predict`` written out (one shuffle of the arms, an arm with too
    few runs first, else one ``normal(mean, sd)`` per arm in the arms' order, the posterior of
    the conjugate update with known precision 1/var): the arm it picks with ``rng``."""
    arms = job.arms
    for arm in rng.choice(np.asarray(arms), len(arms), replace=False):
        if len(job._arm_rewards(int(arm))) < job.spec.mab_num_explorations:
            return int(arm)
    samples = []
    for arm in arms:
        rewards = job._arm_rewards(arm)
        variance = float(np.var(rewards))
        if variance == 0.0:
            mean, sd = float(rewards.mean()), 0.0
        else:
            precision = job.spec.mab_prior_precision + len(rewards) / variance
            mean = (job.spec.mab_prior_precision * job.spec.mab_prior_mean
                    + float(rewards.sum()) / variance) / precision
            sd = math.sqrt(1.0 / precision)
        samples.append(float(rng.normal(mean, sd)))
    return arms[int(np.argmax(samples))]


def test_thompson_sampling_draws_what_zeus_gaussian_ts_draws():
    """Each prediction of the bandit is the arm Zeus's order picks from the same RNG state,
    and leaves the RNG where that order leaves it (the normals drawn as one block are the same
    floats as one ``normal(mean, sd)`` per arm)."""
    job = BatchSizeJob(spec(batch_sizes=(8, 16, 32, 64, 128), default_batch_size=32, seed=7))
    noise = np.random.default_rng(1)
    cost = {8: 980.0, 16: 1000.0, 32: 990.0, 64: 1010.0, 128: 1500.0}
    _through_pruning(job, cost)
    assert job.phase == "mab" and len(job.arms) == 5
    picks = set()
    for _ in range(60):
        reference = np.random.default_rng()
        reference.bit_generator.state = job.rng.bit_generator.state
        expected = _gaussian_ts_reference(job, reference)
        p = job.predict()
        assert p.batch_size == expected
        assert job.rng.bit_generator.state == reference.bit_generator.state
        picks.add(p.batch_size)
        finish(job, p.trial_number, cost[p.batch_size] * (1 + 0.05 * noise.standard_normal()),
               True)
    assert len(picks) > 1  # (the samples decide, not a fixed order)


def test_zero_variance_arms_are_deterministic():
    # two identical observations per arm: precision is infinite, the sample is the mean
    job = BatchSizeJob(spec(batch_sizes=(32, 64), default_batch_size=32))
    _through_pruning(job, {32: 500.0, 64: 400.0})
    assert [run(job, lambda b: ({32: 500.0, 64: 400.0}[b], True)) for _ in range(5)] == [64] * 5


def test_one_pruning_round_explores_arms_with_too_few_observations_first():
    job = BatchSizeJob(spec(batch_sizes=(32, 64, 128), default_batch_size=64,
                            num_pruning_rounds=1, mab_num_explorations=2))
    _through_pruning(job, {32: 300.0, 64: 200.0, 128: 100.0})
    assert job.arms == [32, 64, 128]
    # each arm has one observation: the next three predictions try every arm once more
    nxt = sorted(run(job, lambda b: (100.0 * b / 32, True)) for _ in range(3))
    assert nxt == [32, 64, 128]


def test_window_size_forgets_old_observations():
    # window 1: an arm is judged by its latest run alone (zero variance: its mean exactly)
    job = BatchSizeJob(spec(batch_sizes=(32, 64), default_batch_size=32, window_size=1))
    _through_pruning(job, {32: 500.0, 64: 400.0})
    p = job.predict()
    assert p.batch_size == 64
    finish(job, p.trial_number, 900.0, True)  # 64 drifted
    assert job._arm_rewards(64).tolist() == [-900.0]
    assert [run(job, lambda b: (500.0, True)) for _ in range(3)] == [32] * 3


def test_state_round_trip_continues_the_same_stream():
    noise = np.random.default_rng(5).standard_normal(32)
    costs = iter(500.0 * (1 + 0.3 * noise))  # arms alike and noisy: sampling decides
    job = BatchSizeJob(spec(seed=123))
    for _ in range(12):
        run(job, lambda b: (next(costs), b >= 16))
    twin = BatchSizeJob.from_dict(job.to_dict())
    tail = [(float(c), True) for c in costs]
    a = [run(job, lambda b, c=c: c) for c in tail]
    b = [run(twin, lambda b, c=c: c) for c in tail]
    assert a == b and len(set(a)) > 1


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("change, field", [
    (dict(batch_sizes=(32, 32)), "spec.batch_sizes"),
    (dict(batch_sizes=(0, 32)), "spec.batch_sizes"),
    (dict(max_power_w=0.0), "spec.max_power_w"),
    (dict(target_metric=math.inf), "spec.target_metric"),
    (dict(window_size=-1), "spec.window_size"),
    (dict(mab_num_explorations=0), "spec.mab_num_explorations"),
    (dict(mab_prior_precision=-1.0), "spec.mab_prior_precision"),
    (dict(seed=-1), "spec.seed"),
    (dict(beta_knob=math.nan), "spec.beta_knob"),
])
def test_spec_validation_names_the_field(change, field):
    with pytest.raises(InvalidArgument, match=re.escape(field)):
        spec(**change)


def test_metric_nan_and_unknown_trial_change_nothing():
    job = BatchSizeJob(spec())
    p = job.predict()
    before = job.to_dict()
    with pytest.raises(InvalidArgument, match="metric"):
        job.report(p.trial_number, 1, 1.0, 1.0, math.nan)
    with pytest.raises(Exception, match="trial_number"):
        job.report(5, 1, 1.0, 1.0, 0.0)
    assert job.to_dict() == before


# ----------------------------------------------------------------------------- power limits
def plo(**kw) -> PowerLimitProfile:
    fields = dict(min_power_limit_w=100.0, max_power_limit_w=250.0, eta_knob=0.5, step_w=50.0)
    fields.update(kw)
    max_power_w = fields.pop("max_power_w", fields["max_power_limit_w"])
    return PowerLimitProfile(PowerLimitSpec.create(**fields), max_power_w)


def test_power_limits_go_from_max_to_min_on_the_grid():
    assert PowerLimitSpec.create(min_power_limit_w=100, max_power_limit_w=250,
                                 eta_knob=0.5).power_limits() == [250, 225, 200, 175, 150, 125, 100]
    assert PowerLimitSpec.create(min_power_limit_w=90, max_power_limit_w=250, eta_knob=0.5,
                                 step_w=50).power_limits() == [250, 200, 150, 100]


MEASURED = {250.0: (10.0, 2500.0), 200.0: (10.5, 2000.0), 150.0: (11.5, 1500.0),
            100.0: (20.0, 1400.0)}


@pytest.mark.parametrize("selector, factor, expected", [
    ("zeus_cost", 1.1, 150.0), ("energy", 1.1, 100.0), ("time", 1.1, 250.0),
    ("max_slowdown", 1.1, 200.0), ("max_slowdown", 1.2, 150.0), ("max_slowdown", 2.0, 100.0),
])
def test_selectors(selector, factor, expected):
    p = plo(selector=selector, max_slowdown_factor=factor)
    plan = p.plan()
    while plan.action == "profile":
        plan = p.report_window(plan.power_limit_w, *MEASURED[plan.power_limit_w])
    assert (plan.action, plan.power_limit_w) == ("use", expected)


def test_window_errors_change_nothing():
    p = plo()
    p.report_window(250.0, 10.0, 2500.0)
    before = p.to_dict()
    for args, error, field in [((200.0, math.nan, 1.0), InvalidArgument, "time_s"),
                               ((200.0, 1.0, 0.0), InvalidArgument, "energy_j"),
                               ((300.0, 1.0, 1.0), InvalidArgument, "power_limit_w"),
                               ((150.0, 1.0, 1.0), FailedPrecondition, "power_limit_w")]:
        with pytest.raises(error, match=field):
            p.report_window(*args)
    assert p.to_dict() == before
    assert p.interrupt(200.0).power_limit_w == 200.0 and p.interruptions == 1


def _recorded(path: Path) -> tuple[list[float], dict[float, tuple[float, float]], int]:
    df = pd.read_csv(path)
    gpus = [c for c in df.columns if c.endswith("_energy")]
    df["power_limit_w"] = df.window_name.str.rsplit("_", n=1).str[-1].astype(float)
    # Zeus's GlobalPowerLimitOptimizer: energy summed over GPUs, time as measured
    windows = {float(w): (float(t), float(e)) for w, t, e in
               zip(df.power_limit_w, df.elapsed_time, df[gpus].sum(axis=1))}
    return list(df.power_limit_w), windows, len(gpus)


@needs_profiles
@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.csv")) if PROFILES.is_dir() else [],
                         ids=lambda p: p.stem)
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_recorded_profiling_runs_drive_the_optimizer(path, eta):
    order, windows, gpus = _recorded(path)
    step = order[0] - order[1]
    p = plo(min_power_limit_w=min(order), max_power_limit_w=max(order), step_w=step,
            eta_knob=eta, max_power_w=max(order) * gpus)
    plan, planned = p.plan(), []
    while plan.action == "profile":
        planned.append(plan.power_limit_w)
        if len(planned) == 2:  # a preemption cuts the second window once: it is retried
            assert p.interrupt(plan.power_limit_w).power_limit_w == plan.power_limit_w
        plan = p.report_window(plan.power_limit_w, *windows[plan.power_limit_w])
    assert planned == order  # the recorded run's order: max to min in steps
    cost = {w: eta * e + (1 - eta) * max(order) * gpus * t for w, (t, e) in windows.items()}
    assert plan.power_limit_w == min(cost, key=cost.get)
    reused = PowerLimitProfile.from_dict(p.to_dict())
    assert reused.plan() == plan  # later runs of this batch size reuse the profile


# ----------------------------------------------------------------------------- generations
def _time_for(job: BatchSizeJob, cost: float) -> float:
    """Seconds whose zeus_cost is ``cost`` [J] (energy 0)."""
    return cost / ((1 - job.spec.eta_knob) * job.spec.max_power_w)


def test_an_interrupted_trial_is_suspended_and_prunes_no_arm():
    """The user's report: batch sizes 16/32/64/128, default 64, one reported epoch and then the
    run is preempted. A plain EndTrial counted it as a failure (the downward walk ended and
    only 128 survived); an interrupted one suspends it and the next generation finishes it."""
    job = BatchSizeJob(spec(batch_sizes=(16, 32, 64, 128), default_batch_size=64))
    p = job.predict()
    assert p.batch_size == 64
    job.report(p.trial_number, 1, 5.0, 500.0, 0.1)
    verdict = job.end_trial(p.trial_number, interrupted=True, time_s=7.0, energy_j=700.0, now=10.0)
    assert verdict.suspended and verdict.stop and not verdict.finished
    trial = job.trials[0]
    assert (trial["status"], trial["epochs"], trial["time_s"], trial["energy_j"]) == (
        "suspended", 1, 7.0, 700.0)
    assert trial["interruptions"] == 1 and trial["suspended_at"] == 10.0
    assert job.observations == [] and job.pruning["trial"] == p.trial_number
    concurrent = job.predict(now=11.0)  # still in flight: the best known size, not exploring
    assert not concurrent.exploration
    job.end_trial(concurrent.trial_number)
    with pytest.raises(FailedPrecondition, match="trial_number.*suspended"):
        job.report(p.trial_number, 2, 9.0, 900.0, 0.95)
    resumed = job.resume(p.trial_number)
    assert (resumed.batch_size, resumed.epochs, resumed.time_s, resumed.energy_j) == (
        64, 1, 7.0, 700.0)
    verdict = job.report(p.trial_number, 2, 7.0 + 5.0, 700.0 + 500.0, 0.95)
    assert verdict.finished and verdict.converged
    assert verdict.cost_j == pytest.approx(job.spec.cost(1200.0, 12.0))
    order = [64]
    while job.phase == "pruning":
        order.append(run(job, lambda b: (100.0 * b, True)))
    assert order[:4] == [64, 32, 16, 128]
    assert job.arms == [16, 32, 64, 128]


def test_a_real_failure_after_a_resume_still_counts_as_not_converged():
    job = BatchSizeJob(spec(num_pruning_rounds=1))
    p = job.predict(generation=1)
    job.report(p.trial_number, 1, 1.0, 10.0, 0.0, generation=1)
    job.end_trial(p.trial_number, interrupted=True, time_s=1.5, energy_j=15.0, generation=1)
    job.resume(p.trial_number, generation=2)
    job.report(p.trial_number, 2, 2.5, 25.0, 0.0, generation=2)
    verdict = job.end_trial(p.trial_number, generation=2)
    assert verdict.finished and not verdict.converged and not verdict.suspended
    assert job.observations == [(32, pytest.approx(-job.spec.cost(25.0, 2.5)))]
    assert job.predict().batch_size == 64  # the failed default ended the downward walk
    with pytest.raises(FailedPrecondition, match="trial_number.*already ended"):
        job.resume(p.trial_number, generation=3)


def test_a_miss_of_the_target_over_two_generations_ends_the_trial_as_before():
    job = BatchSizeJob(spec(num_pruning_rounds=1, max_epochs=3))
    p = job.predict()
    job.report(p.trial_number, 1, 1.0, 0.0, 0.0)
    job.end_trial(p.trial_number, interrupted=True)  # no figures: the stored ones
    assert job.trials[0]["time_s"] == 1.0
    job.resume(p.trial_number)
    assert not job.report(p.trial_number, 2, 2.0, 0.0, 0.0).stop
    verdict = job.report(p.trial_number, 3, 3.0, 0.0, 0.0)  # max_epochs across generations
    assert verdict.finished and not verdict.converged and "max_epochs" in verdict.message


def test_an_interruption_in_the_bandit_phase_observes_nothing():
    job = BatchSizeJob(spec(batch_sizes=(32, 64), default_batch_size=32, num_pruning_rounds=1,
                            mab_num_explorations=1))
    _through_pruning(job, {32: 500.0, 64: 400.0})
    before = list(job.observations)
    p = job.predict()
    job.report(p.trial_number, 1, _time_for(job, 10.0), 0.0, 0.0)
    job.end_trial(p.trial_number, interrupted=True, time_s=_time_for(job, 1e6))
    assert job.observations == before and job.arms == [32, 64]
    job.resume(p.trial_number)
    job.report(p.trial_number, 2, _time_for(job, 2e6), 0.0, 1.0)
    assert job.observations[-1] == (p.batch_size, pytest.approx(-2e6))


def test_generations_fence_a_trial_to_its_holder():
    job = BatchSizeJob(spec())
    p = job.predict(generation=3)
    job.report(p.trial_number, 1, 1.0, 1.0, 0.0, generation=3)
    before = job.to_dict()
    for call, field in [
            (lambda: job.report(p.trial_number, 2, 2.0, 2.0, 0.0, generation=2), "generation"),
            (lambda: job.report(p.trial_number, 2, 2.0, 2.0, 0.0, generation=4), "generation"),
            (lambda: job.end_trial(p.trial_number, interrupted=True, generation=2), "generation"),
            (lambda: job.resume(p.trial_number, generation=3), "trial_number"),  # held by 3
            (lambda: job.resume(p.trial_number), "trial_number"),  # no generation: no takeover
            (lambda: job.resume(p.trial_number, generation=2), "generation"),
            (lambda: job.report(p.trial_number, 2, 2.0, 2.0, 0.0, generation=2**63),
             "generation"),
            (lambda: job.predict(generation=-1), "generation")]:
        with pytest.raises((FailedPrecondition, InvalidArgument), match=f"^{field}: "):
            call()
        assert job.to_dict() == before
    # generation 3 was killed without grace: generation 4 takes the running trial over
    r = job.resume(p.trial_number, generation=4)
    assert r.taken_over and r.generation == 4 and r.epochs == 1
    assert job.trials[0]["interruptions"] == 1
    with pytest.raises(FailedPrecondition, match="^generation: .*replaced"):
        job.report(p.trial_number, 2, 2.0, 2.0, 0.0, generation=3)   # the zombie
    assert not job.report(p.trial_number, 2, 2.0, 2.0, 0.0, generation=4).stop
    job.end_trial(p.trial_number, interrupted=True, generation=4)
    assert job.resume(p.trial_number, generation=5).taken_over is False
    with pytest.raises(FailedPrecondition, match="^trial_number: .*running"):
        job.resume(p.trial_number, generation=5)  # a second resume of the same generation


def test_suspension_figures_are_checked_and_a_refusal_changes_nothing():
    job = BatchSizeJob(spec())
    p = job.predict()
    job.report(p.trial_number, 1, 10.0, 100.0, 0.0)
    before = job.to_dict()
    for kwargs, error, field in [
            (dict(interrupted=True, time_s=math.nan), InvalidArgument, "time_s"),
            (dict(interrupted=True, time_s=math.inf), InvalidArgument, "time_s"),
            (dict(interrupted=True, energy_j=-1.0), InvalidArgument, "energy_j"),
            (dict(interrupted=True, time_s=1e300), InvalidArgument, "time_s"),
            (dict(interrupted=True, time_s=9.0), FailedPrecondition, "time_s"),
            (dict(interrupted=True, energy_j=99.0), FailedPrecondition, "energy_j"),
            (dict(time_s=20.0), InvalidArgument, "time_s"),        # without interrupted
            (dict(energy_j=200.0), InvalidArgument, "energy_j")]:
        with pytest.raises(error, match=f"^{field}: "):
            job.end_trial(p.trial_number, **kwargs)
        assert job.to_dict() == before
    with pytest.raises(NotFound, match="trial_number"):
        job.end_trial(99, interrupted=True)
    with pytest.raises(NotFound, match="trial_number"):
        job.resume(-1)
    first = job.end_trial(p.trial_number, interrupted=True, time_s=12.0, energy_j=120.0, now=5.0)
    again = job.end_trial(p.trial_number, interrupted=True, time_s=12.0, energy_j=120.0, now=9.0)
    assert first == again and job.trials[0]["interruptions"] == 1  # a retry changes nothing
    assert job.trials[0]["suspended_at"] == 5.0


def test_a_stale_suspended_trial_is_abandoned_at_the_next_predict_without_a_verdict():
    job = BatchSizeJob(spec(suspended_trial_timeout_s=100.0))
    p = job.predict(now=0.0)
    job.report(p.trial_number, 1, 10.0, 100.0, 0.1)
    job.end_trial(p.trial_number, interrupted=True, now=1000.0)
    early = job.predict(now=1099.0)  # not stale yet: pruning's trial is still in flight
    assert not early.exploration and job.trials[0]["status"] == "suspended"
    job.end_trial(early.trial_number)
    late = job.predict(now=1100.0)
    assert job.trials[0]["status"] == "abandoned"
    assert (late.batch_size, late.exploration) == (p.batch_size, True)  # planned again
    assert job.observations == [] and job.min_cost is None
    with pytest.raises(FailedPrecondition, match="abandoned"):
        job.resume(p.trial_number)
    with pytest.raises(InvalidArgument, match="spec.suspended_trial_timeout_s"):
        spec(suspended_trial_timeout_s=-1.0)
    with pytest.raises(InvalidArgument, match="spec.suspended_trial_timeout_s"):
        spec(suspended_trial_timeout_s=1e10)


def test_state_stored_before_generations_loads_with_defaults():
    job = BatchSizeJob(spec())
    job.predict()
    old = job.to_dict()
    for t in old["trials"]:
        for key in ("generation", "interruptions", "suspended_at"):
            del t[key]
    del old["spec"]["suspended_trial_timeout_s"]
    loaded = BatchSizeJob.from_dict(old)
    assert loaded.trials[0]["generation"] == 0 and loaded.spec.suspended_trial_timeout_s == 86400
    loaded.end_trial(1, interrupted=True)
    assert loaded.resume(1).epochs == 0
