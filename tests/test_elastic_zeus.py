"""A task carrying a Zeus batch-size job (docs/execution.md, offcut.client.training) with real
PyTorch processes (gloo on 127.0.0.1) training examples/elastic_digits against a real daemon,
no Slurm: the global batch size comes from the daemon's optimizer and the per-rank batch
follows the world size; a stop signal in the middle of a trial suspends it, the next
generation (another world size) resumes it, and the trial's epochs, time and energy add up
across the generations; over 3 recurrences the job prunes exactly as the same seeded job
without the preemption. Also the ``on_restart`` hook of ElasticRun (in process)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from offcut.client.elastic import EXIT_RESTART, ElasticRun, latest_checkpoint
from offcut.v1 import zeus_pb2

from daemon_helpers import wait_until, zeus_spec
from elastic_helpers import SIGNAL_AT_SAMPLES, Generation, free_port


#: batch sizes 32/64/128 (default 64), one pruning round: 3 recurrences try 64, 32 (down), 128
#: (up). The example reaches 93 % test accuracy after 2 epochs of 32 (85 % after one), 3 of
#: 64, 5 of 128 (92 % after four): a few test images either side of the target, so that the
#: epochs do not depend on the world size's floating-point summation order; beta_knob and
#: max_epochs are generous so every trial converges whatever the machine's speed, and the
#: outcome does not depend on the (wall-clock) costs.
TARGET = 0.93
POWER_W = 100.0         # --zeus-power-w: modelled draw of one rank [W]
MAX_POWER_W = 300.0
EPOCH = 1500            # samples of one Zeus epoch (the train images)
ARGS = ["--checkpoint-every-s", "0", "--zeus-power-w", str(POWER_W),
        "--collective-timeout-s", "60"]
#: recurrence -> (world size of each generation, (samples, rank, signal) of generation 1's
#: signal): the interruptions of job "preempted". Recurrence 2 (trial 2, batch size 32): the
#: stop signal to rank 1 at the step at 2,300 samples, in the middle of the trial's second
#: epoch (1,500 .. 3,000); generation 2 on 3 ranks. Recurrence 3 (trial 3, batch size 128):
#: rank 1 SIGKILLed at the step at 5,012 samples, in the middle of its fourth epoch: rank 0
#: loses its peer and suspends the trial; generation 2 on 1 rank resumes from the checkpoint
#: of the third epoch's end (4,500).
INTERRUPTIONS = {2: ((2, 3), (2300, 1, "")), 3: ((2, 1), (5000, 1, "KILL"))}

EPOCH_LINE = re.compile(r"zeus epoch (\d+) of trial (\d+) \(batch size (\d+), world size (\d+)\): "
                        r"test accuracy (\d+\.\d+)%")
SUMMARY = re.compile(r"zeus: trial (\d+) (\w+) after epoch (\d+): this generation measured "
                     r"(\d+\.\d+) s, (\d+\.\d+) J; the trial (\d+\.\d+) s, (\d+\.\d+) J")
PER_RANK = re.compile(r"zeus trial (\d+): global batch size (\d+), world size (\d+): rank (\d+) "
                      r"trains (\d+) samples per step")
#: the printed figures' rounding [s], [J]
TOL = 2e-3




def job_spec(job_id: str) -> zeus_pb2.BatchSizeJobSpec:
    """The shared Zeus spec with batch sizes 32-128, one pruning round, no power limits, and
    (beta 1000) practically no early stop."""
    return zeus_spec(job_id, batch_sizes=[32, 64, 128], beta_knob=1000.0, target_metric=TARGET,
                     max_power_w=MAX_POWER_W, num_pruning_rounds=1, power=None)


def run_task(tmp_path: Path, address: str, job_id: str, recurrence: int, worlds: tuple[int, ...],
             signal_at: tuple[int, int, str] | None = None) -> list[Generation]:
    """One recurrence: a task's run from a fresh checkpoint directory, generation after
    generation (world size ``worlds[g - 1]``) until one exits 0. ``signal_at``: (samples,
    rank, signal name; "" = the stop signal) of generation 1."""
    ckdir = tmp_path / f"{job_id}-ckpt-{recurrence}"
    logs = tmp_path / f"{job_id}-logs-{recurrence}"
    base = {"OFFCUT_ADDRESS": address, "OFFCUT_ZEUS_JOB_ID": job_id}
    generations = []
    for number, world in enumerate(worlds, start=1):
        extra, script, expected = dict(base), None, [EXIT_RESTART] * world
        if signal_at is not None and number == 1:
            samples, rank, name = signal_at
            extra.update(OFFCUT_TEST_SIGNAL_AT=str(samples), OFFCUT_TEST_SIGNAL_RANK=str(rank),
                         OFFCUT_TEST_SIGNAL=name)
            script = ["-c", SIGNAL_AT_SAMPLES]
            if name:
                expected[rank] = -signal.Signals["SIG" + name]
        g = Generation(world, ckdir, logs, ARGS, generation=number, extra=extra, script=script)
        generations.append(g)
        try:
            codes = g.wait()
        finally:
            g.kill()
        if codes == [0] * world:
            return generations
        assert codes == expected and number < len(worlds), g.tails()
    raise AssertionError(f"recurrence {recurrence} of {job_id} did not end in {len(worlds)} "
                         f"generations")


def zeus_lines(g: Generation) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(epoch lines, summaries, per-rank lines of every rank) of a generation."""
    out0 = g.ranks[0].out
    epochs = [(int(e), int(t), int(b), int(w), float(a)) for e, t, b, w, a in
              EPOCH_LINE.findall(out0)]
    summaries = [(int(t), s, int(e), float(dt), float(de), float(tt), float(te))
                 for t, s, e, dt, de, tt, te in SUMMARY.findall(out0)]
    per_rank = [tuple(int(v) for v in m) for r in g.ranks for m in PER_RANK.findall(r.out)]
    return epochs, summaries, per_rank


@pytest.mark.slow
def test_an_interrupted_trial_continues_in_the_next_generation_and_prunes_nothing(daemon, example,
                                                                                  torch, tmp_path):
    """Job "plain": 3 recurrences of the example on 2 ranks, undisturbed. Job "preempted"
    (same spec and seed): the same, but recurrence 2's trial (batch size 32) gets the stop
    signal in the middle of an epoch and recurrence 3's (128) loses a rank in the middle of
    one; each time generation 2 on another world size resumes the trial. The trials continue
    (same number, epochs numbered on, converged), their time and energy are the sums of both
    generations' measurements, and the batch sizes, statuses and surviving arms equal the
    undisturbed job's."""
    from offcut.zeus_views import zeus_cost

    srv, client = daemon
    outcome = {}
    for job_id, plan in (("plain", {}), ("preempted", INTERRUPTIONS)):
        client.register_zeus_job(job_spec(job_id))
        runs = [run_task(tmp_path, srv.address, job_id, recurrence,
                         *plan.get(recurrence, ((2,), None)))
                for recurrence in (1, 2, 3)]
        outcome[job_id] = (runs, client.get_zeus_job(job_id))

    (plain_runs, plain), (runs, job) = outcome["plain"], outcome["preempted"]
    # the optimizer's choices and outcome are those of the undisturbed job: nothing pruned
    assert [t.batch_size for t in job.trials] == [t.batch_size for t in plain.trials] \
        == [64, 32, 128]
    assert [t.status for t in job.trials] == [t.status for t in plain.trials] \
        == ["converged"] * 3
    assert (job.phase, plain.phase) == ("mab", "mab")
    assert json.loads(job.state_json)["arms"] == json.loads(plain.state_json)["arms"] \
        == [32, 64, 128]
    assert [t.interruptions for t in job.trials] == [0, 1, 1]
    assert [t.generation for t in job.trials] == [1, 2, 2]
    assert [t.interruptions for t in plain.trials] == [0, 0, 0]
    assert [t.epochs for t in job.trials] == [t.epochs for t in plain.trials] == [3, 2, 5]

    # every generation's ranks train the trial's global batch split by its world size
    for job_runs in (plain_runs, runs):
        for trial_number, gens in enumerate(job_runs, start=1):
            b = job.trials[trial_number - 1].batch_size
            for g in gens:
                world = len(g.ranks)
                shares = [b // world + (1 if r < b % world else 0) for r in range(world)]
                assert zeus_lines(g)[2] == [(trial_number, b, world, r, shares[r])
                                            for r in range(world)], g.tails()
    assert [[p[4] for p in zeus_lines(g)[2]] for g in runs[1]] == [[16, 16], [11, 11, 10]]
    assert [[p[4] for p in zeus_lines(g)[2]] for g in runs[2]] == [[64, 64], [128]]

    # the uninterrupted runs: one generation, epochs 1.. reported once, converged
    for job_runs, record in ((plain_runs, plain), (runs[:1], job)):
        for trial_number, gens in enumerate(job_runs, start=1):
            [g] = gens
            epochs, summaries, _ = zeus_lines(g)
            t = record.trials[trial_number - 1]
            assert [e[0] for e in epochs] == list(range(1, t.epochs + 1))
            assert epochs[-1][4] >= 100 * TARGET > max(e[4] for e in epochs[:-1] or [(0,) * 5])
            assert [s[:3] for s in summaries] == [(trial_number, "converged", t.epochs)]
            assert summaries[0][5:] == pytest.approx((t.time_s, t.energy_j), abs=TOL)
            assert t.generation == 1

    # the interrupted trials
    (g1, g2), (k1, k2) = runs[1], runs[2]
    stops = [int(r.wait_for(r"stopping at (\d+) samples").group(1)) for r in g1.ranks]
    assert stops == [2300, 2300]                    # the same step, mid-epoch 2
    assert "(got SIGUSR1)" in g1.ranks[1].err and "(by a peer)" in g1.ranks[0].err
    assert "a peer of generation 1 vanished" in k1.ranks[0].err
    ck = torch.load(tmp_path / "preempted-ckpt-2" / "ckpt-2300.pt", weights_only=True)
    assert ck["state"]["zeus"] == {"job": "preempted", "trial": 2, "batch_size": 32,
                                   "finished": False}
    assert "resumed from ckpt-2300.pt (2300 samples, written by generation 1 on 2" \
        in g2.ranks[0].err
    # the lost peer's generation resumes from its last checkpoint: the third epoch's end
    assert "resumed from ckpt-4500.pt (4500 samples, written by generation 1 on 2" \
        in k2.ranks[0].err
    figures = []
    for (first, second), t, reported in (((g1, g2), job.trials[1], 1), ((k1, k2), job.trials[2], 3)):
        epochs1, [s1] = zeus_lines(first)[:2]
        epochs2, [s2] = zeus_lines(second)[:2]
        n = t.trial_number
        # generation 1: epochs 1..reported, then suspended (before the exit 75)
        assert [e[:2] for e in epochs1] == [(e, n) for e in range(1, reported + 1)]
        assert max(e[4] for e in epochs1) < 100 * TARGET
        assert s1[:3] == (n, "suspended", reported)
        # generation 2: the same trial, epochs numbered on, converged
        assert [e[:2] for e in epochs2] == [(e, n) for e in range(reported + 1, t.epochs + 1)]
        assert epochs2[-1][4] >= 100 * TARGET and s2[:3] == (n, "converged", t.epochs)
        (t1, e1), (t2, e2) = s1[3:5], s2[3:5]
        assert t1 > 0 and t2 > 0 and s1[5:] == (t1, e1)
        # the modelled energy: --zeus-power-w x the generation's ranks x its time
        assert e1 == pytest.approx(POWER_W * len(first.ranks) * t1, rel=1e-3, abs=TOL)
        assert e2 == pytest.approx(POWER_W * len(second.ranks) * t2, rel=1e-3, abs=TOL)
        assert s2[5:] == pytest.approx((t1 + t2, e1 + e2), abs=TOL)
        # the daemon's record: both generations' time and energy, the cost of their sums
        assert t.time_s >= t1 + t2 - TOL and t.energy_j >= e1 + e2 - TOL
        assert (t.time_s, t.energy_j) == pytest.approx((t1 + t2, e1 + e2), abs=TOL)
        assert t.cost_j == pytest.approx(zeus_cost(t.energy_j, t.time_s, 0.5, MAX_POWER_W))
        u = plain.trials[n - 1]
        figures.append(f"trial {n} (batch size {t.batch_size}, epochs {t.epochs}): generation 1 "
                       f"({len(first.ranks)} ranks) {t1:.4f} s, {e1:.3f} J + generation 2 "
                       f"({len(second.ranks)} ranks) {t2:.4f} s, {e2:.3f} J = the daemon's "
                       f"{t.time_s:.4f} s, {t.energy_j:.3f} J, cost {t.cost_j:.3f} J "
                       f"(undisturbed: {u.time_s:.4f} s, {u.energy_j:.3f} J, cost "
                       f"{u.cost_j:.3f} J)")
    print("\n" + "\n".join(figures))
    # the final checkpoints say the trials ended
    for recurrence, samples, world in ((2, 2 * EPOCH, 3), (3, 5 * EPOCH, 1)):
        last = latest_checkpoint(tmp_path / f"preempted-ckpt-{recurrence}")
        ck = torch.load(last[1], weights_only=True)
        assert ck["state"]["zeus"]["finished"] and ck["state"]["zeus"]["trial"] == recurrence
        assert (ck["samples_done"], ck["generation"], ck["world_size"]) == (samples, 2, world)


# ----------------------------------------------------------------------------- in-process
def test_on_restart_runs_once_before_every_exit_75_and_never_changes_it(torch, tmp_path):
    """ElasticRun(on_restart=...): called after the stop's checkpoint and on a lost peer,
    once, before the exit 75; a failing hook is logged and the exit stays 75; a normal end
    (exit 0) and other errors do not call it."""
    def env():
        return {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "OFFCUT_CHECKPOINT_DIR": str(tmp_path)}

    calls = []
    run = ElasticRun.from_env(env(), timeout_s=10, hard_exit=False,
                              on_restart=lambda: calls.append(latest_checkpoint(tmp_path)[0]))
    with pytest.raises(SystemExit) as exc:
        with run:
            run.load_checkpoint()
            assert not run.step(64, {"w": 1}) and calls == []
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_until(lambda: run.stop_requested, "the handler")
            run.step(128, {"w": 2})
    assert exc.value.code == EXIT_RESTART and calls == [128]   # after the checkpoint

    def failing():
        calls.append("failing")
        raise RuntimeError("the daemon is away")

    run = ElasticRun.from_env(env(), timeout_s=10, hard_exit=False)
    run.on_restart = failing                       # the attribute, set once the run is up
    with pytest.raises(SystemExit) as exc:
        with run:
            run.load_checkpoint()
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1: "
                               "Connection reset by peer")
    assert exc.value.code == EXIT_RESTART and calls == [128, "failing"]
    with pytest.raises(SystemExit):
        run.exit_restart()                          # once per run
    assert calls == [128, "failing"]

    with pytest.raises(KeyError):                   # a failure: no hook
        with ElasticRun.from_env(env(), timeout_s=10, hard_exit=False,
                                 on_restart=lambda: calls.append("x")):
            raise KeyError("boom")
    with pytest.raises(SystemExit) as exc:          # the end: exit 0, no hook
        with ElasticRun.from_env(env(), timeout_s=10, hard_exit=False,
                                 on_restart=lambda: calls.append("x")):
            pass
    assert exc.value.code == 0 and calls == [128, "failing"]
