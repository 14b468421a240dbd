"""The training side of the execution protocol (docs/execution.md, offcut.client.elastic) with
real PyTorch processes (gloo on 127.0.0.1) training examples/elastic_digits: a stop signal to
one rank checkpoints on rank 0 and exits 75 everywhere at the same step, the next generation
resumes on another world size and its accuracy matches an undisturbed run, progress reports
reach a real daemon and complete the task, a killed rank 0 does not hang the survivors, a
signal during the rendezvous ends the process at once; unit tests of the environment, the
checkpoint files and the exit mapping."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from offcut.client.elastic import (EXIT_RESTART, ElasticEnv, ElasticRun, checkpoint_files,
                                   is_peer_loss, latest_checkpoint, parse_signal,
                                   write_checkpoint)
from offcut.v1 import tasks_pb2
from offcut.views import TaskState

from daemon_helpers import wait_until
from elastic_helpers import (LOAD_ONLY, RENDEZVOUS_ONLY, Generation, Rank, final_accuracy,
                             free_port, port_listening, rank_env)





def local_env(tmp_path: Path, **extra) -> dict[str, str]:
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OFFCUT_CHECKPOINT_DIR": str(tmp_path)}
    env.update(extra)
    return env


# ----------------------------------------------------------------------------- processes
TOTAL = 24_000                      # samples: ~16 epochs of the 1,500 train images
ARGS = ["--batch-size", "64", "--checkpoint-every-steps", "40", "--checkpoint-every-s", "0"]
REPORTED = re.compile(r"reported (\d+(?:\.\d+)?) samples on (\d+) nodes")


@pytest.mark.slow
def test_stop_signal_restart_on_another_world_size_reports_and_accuracy(daemon, example,
                                                                         torch, tmp_path):
    """Generation 1 (4 ranks) gets SIGUSR1 on rank 2 mid-training: every rank stops at the
    same step, rank 0 writes that step's checkpoint and reports it, all exit 75. The daemon
    shrinks the task to 2 nodes; generation 2 (2 ranks) resumes from the checkpoint, finishes
    (exit 0), and its last report completes the task. The interrupted run's accuracy is
    within 1 point of an undisturbed run of the same samples."""
    srv, client = daemon
    client.report_nodes(time.time(), "slurm", 1, idle=["n1", "n2", "n3", "n4"])
    task = client.submit(tasks_pb2.TaskSpec(name="digits", min_nodes=1, max_nodes=4,
                                            total_work_samples=TOTAL,
                                            reports_progress=True)).task
    assert len(task.nodes) == 4
    ckdir = tmp_path / "checkpoints" / task.task_id
    logs = tmp_path / "logs"
    daemon_env = {"OFFCUT_TASK_ID": task.task_id, "OFFCUT_ADDRESS": srv.address}

    # --- generation 1: 4 ranks; --samples comes from the task's total work
    g1 = Generation(4, ckdir, logs, ARGS, generation=1, extra=daemon_env)
    try:
        g1.ranks[0].wait_for(r"checkpoint: \d+ samples", stream="out")  # training runs
        g1.ranks[2].signal(signal.SIGUSR1)
        codes = g1.wait()
    finally:
        g1.kill()
    assert codes == [EXIT_RESTART] * 4, g1.tails()
    stops = [int(r.wait_for(r"stopping at (\d+) samples").group(1)) for r in g1.ranks]
    assert len(set(stops)) == 1, stops              # the same step on every rank
    stop = stops[0]
    assert 0 < stop < TOTAL and stop % 64 == 0
    assert "(got SIGUSR1)" in g1.ranks[2].err
    assert all("(by a peer)" in r.err for r in (g1.ranks[0], g1.ranks[1], g1.ranks[3]))
    files = checkpoint_files(ckdir)
    assert len(files) == 2 and files[-1][0] == stop     # the stop's checkpoint, keep=2
    assert not [p for p in ckdir.iterdir() if p.name.endswith(".tmp")]
    ck = torch.load(files[-1][1], weights_only=True)
    assert (ck["samples_done"], ck["generation"], ck["world_size"]) == (stop, 1, 4)
    assert f"checkpoint ckpt-{stop}.pt" in g1.ranks[0].err      # written by rank 0 only
    assert not any("checkpoint ckpt-" in r.err for r in g1.ranks[1:])
    got = client.get_task(task.task_id)
    assert got.model.last_samples_done == pytest.approx(stop)
    assert 4 in [m.nodes for m in got.model.measured]           # reports on 4 nodes, clean

    # --- the daemon shrinks the task to 2 nodes: generation 2 with 2 ranks resumes
    client.report_nodes(time.time(), "slurm", 2, preempted=list(task.nodes[2:]))
    assert len(client.get_task(task.task_id).nodes) == 2
    g2 = Generation(2, ckdir, logs, ARGS, generation=2, extra=daemon_env)
    try:
        codes = g2.wait()
    finally:
        g2.kill()
    assert codes == [0, 0], g2.tails()
    for r in g2.ranks:
        assert f"resumed from ckpt-{stop}.pt ({stop} samples, written by generation 1 on 4" in r.err
    acc, samples = final_accuracy(g2.ranks[0].out)
    assert samples == TOTAL
    last = latest_checkpoint(ckdir)
    assert last[0] == TOTAL
    ck = torch.load(last[1], weights_only=True)
    assert (ck["samples_done"], ck["generation"], ck["world_size"]) == (TOTAL, 2, 2)
    got = client.get_task(task.task_id)
    assert got.state == TaskState.COMPLETED
    assert got.model.last_samples_done == pytest.approx(TOTAL)
    assert 2 in [m.nodes for m in got.model.measured]

    # every report: nodes = the generation's world size, samples never down, none refused
    reports = [(float(s), int(n), gen) for gen, r in ((1, g1.ranks[0]), (2, g2.ranks[0]))
               for s, n in REPORTED.findall(r.err)]
    assert [n for _, n, gen in reports] == [{1: 4, 2: 2}[gen] for _, _, gen in reports]
    figures = [s for s, _, _ in reports]
    assert figures == sorted(figures) and figures[-1] == TOTAL
    assert stop in figures and min(s for s, _, gen in reports if gen == 2) > stop
    assert all((s - stop) % 2560 == 0 for s, _, gen in reports if gen == 2 and s < TOTAL)
    assert not any("failed" in r.err for r in g1.ranks[:1] + g2.ranks[:1])

    # --- an undisturbed run of the same samples (one local process, no daemon)
    g0 = Generation(1, tmp_path / "undisturbed", logs, ARGS + ["--samples", str(TOTAL)],
                    generation=None)
    try:
        assert g0.wait() == [0], g0.tails()
    finally:
        g0.kill()
    acc0, samples0 = final_accuracy(g0.ranks[0].out)
    print(f"\nfinal test accuracy: undisturbed {acc0:.2f}% (1 rank), interrupted {acc:.2f}% "
          f"(4 ranks to {stop} samples, then 2 ranks) after {TOTAL} samples")
    assert samples0 == TOTAL
    assert acc0 > 90.0 and acc > 90.0
    assert abs(acc - acc0) <= 1.0


@pytest.mark.slow
def test_killing_rank_0_makes_the_survivors_exit_75_within_the_collective_timeout(example,
                                                                                 tmp_path):
    """SIGKILL of rank 0 (the host of the rendezvous' store) mid-training: ranks 1 and 2 see
    their collective fail and exit 75 well within the collective timeout, without hanging."""
    timeout_s = 5
    g = Generation(3, tmp_path / "ckpt", tmp_path / "logs",
                   ["--samples", "10000000", "--batch-size", "48", "--checkpoint-every-steps",
                    "20", "--collective-timeout-s", str(timeout_s)])
    try:
        g.ranks[0].wait_for(r"checkpoint: \d+ samples", stream="out")
        g.ranks[0].signal(signal.SIGKILL)
        killed = time.monotonic()
        codes = g.wait(timeout_s=60)
        took = max(r.ended for r in g.ranks[1:]) - killed
    finally:
        g.kill()
    assert codes == [-signal.SIGKILL, EXIT_RESTART, EXIT_RESTART], g.tails()
    assert took < timeout_s + 10, took      # detected at once (gloo) or by the timeout
    for r in g.ranks[1:]:
        assert "a peer of generation 1 vanished" in r.err
        assert "Traceback" not in r.err


def test_a_signal_during_the_rendezvous_ends_the_process_at_once(torch, tmp_path):
    """Ranks 0 and 1 of a generation of 3 whose rank 2 never comes wait in the rendezvous (in
    C++): SIGTERM ends rank 1 and OFFCUT_STOP_SIGNAL ends rank 0 at once, by the signal."""
    import torch.distributed as dist

    g = Generation(2, tmp_path / "ckpt", tmp_path / "logs", [], script=["-c", RENDEZVOUS_ONLY],
                   extra={"WORLD_SIZE": "3"})
    try:
        for r in g.ranks:
            r.wait_for(r"rendezvous of generation 1 at 127\.0\.0\.1:\d+ as rank \d of 3")
        wait_until(lambda: port_listening(g.port), "rank 0's store")
        store = dist.TCPStore("127.0.0.1", g.port, is_master=False,
                              timeout=timedelta(seconds=30))
        wait_until(lambda: store.add("offcut/rendezvous/1", 0) == 2,
                   "both ranks inside the rendezvous")
        del store
        for r, sig in ((g.ranks[1], signal.SIGTERM), (g.ranks[0], signal.SIGUSR1)):
            sent = time.monotonic()
            r.signal(sig)
            assert r.wait(timeout_s=30) == -sig, r.tail()
            assert r.ended - sent < 10      # the rendezvous would wait 120 s
            assert "up" not in r.out
    finally:
        g.kill()


def test_a_checkpoint_directory_not_shared_by_all_ranks_fails_the_run(torch, tmp_path):
    """Rank 0 picks the latest checkpoint and every rank opens it by name: a rank whose
    OFFCUT_CHECKPOINT_DIR lacks it fails (exit 1) instead of training from other weights;
    rank 0 then loses its peer (exit 75)."""
    shared, private = tmp_path / "shared", tmp_path / "private"
    write_checkpoint(shared, 640, {"state": {}, "samples_done": 640, "generation": 1,
                                   "world_size": 2})
    port = free_port()
    ranks = [Rank([sys.executable, "-c", LOAD_ONLY], rank_env(r, 2, port, d, generation=2),
                  tmp_path / "logs", f"rank{r}") for r, d in ((0, shared), (1, private))]
    try:
        codes = [r.wait() for r in ranks]
    finally:
        for r in ranks:
            r.kill()
    # rank 1's exception propagates (exit 1; torch's C++ teardown at interpreter exit
    # occasionally turns that into SIGABRT, a failure as well)
    assert codes[0] == EXIT_RESTART and codes[1] in (1, -signal.SIGABRT), \
        "\n".join(r.tail() for r in ranks)
    assert "loaded 640" in ranks[0].out and "loaded" not in ranks[1].out
    assert "ckpt-640.pt, rank 0's latest checkpoint, is not here" in ranks[1].err


# ----------------------------------------------------------------------------- in-process
def test_stop_flag_step_checkpoints_and_exit_mapping_in_process(torch, tmp_path):
    """One rank in this process: the stop signal only sets a flag once the group is up,
    should_stop/step agree on it, step checkpoints every N steps and on the time limit, a
    stop exits 75 after a checkpoint; the context manager maps a lost peer to 75 and lets
    other errors through; the previous signal handlers come back."""
    previous = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    run = ElasticRun.from_env(local_env(tmp_path), timeout_s=10, checkpoint_every_steps=3,
                              hard_exit=False)
    with pytest.raises(SystemExit) as exc:
        with run:
            assert run.backend == "gloo" and str(run.device) == "cpu"
            assert run.load_checkpoint() is None and run.samples_done == 0
            assert not run.should_stop()
            assert [run.step(64 * i, {"w": torch.tensor([i])}) for i in (1, 2, 3)] == \
                [False, False, True]
            assert [n for n, _ in checkpoint_files(tmp_path)] == [192]
            with pytest.raises(ValueError, match="went down"):
                run.save_checkpoint({}, 128)
            os.kill(os.getpid(), signal.SIGUSR1)          # a flag, not the end
            wait_until(lambda: run.stop_requested, "the handler")
            assert run.should_stop()
            calls = []
            run.step(256, lambda: calls.append(1) or {"w": torch.tensor([9])})
    assert exc.value.code == EXIT_RESTART and calls == [1]
    assert [n for n, _ in checkpoint_files(tmp_path)] == [192, 256]
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == previous
    assert not torch.distributed.is_initialized()

    # the next run resumes; time-based checkpoints; a lost peer exits 75
    run = ElasticRun.from_env(local_env(tmp_path), timeout_s=10, checkpoint_every_s=0.05,
                              hard_exit=False)
    with pytest.raises(SystemExit) as exc:
        with run:
            ck = run.load_checkpoint()
            assert ck["state"]["w"].item() == 9 and run.samples_done == 256
            assert (ck["generation"], ck["world_size"]) == (0, 1)
            n = iter(range(257, 10**6))
            wait_until(lambda: run.step(next(n), {"w": torch.tensor([1])}), "a timed checkpoint")
            assert run.checkpoint_due
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
                               "error [127.0.0.1]:1234: Connection reset by peer")
    assert exc.value.code == EXIT_RESTART
    assert latest_checkpoint(tmp_path)[0] > 256

    # other errors are failures (propagate); a checkpoint below the latest on disk is refused
    run = ElasticRun.from_env(local_env(tmp_path), timeout_s=10, hard_exit=False)
    with pytest.raises(ValueError, match="load_checkpoint"):
        with run:
            run.save_checkpoint({}, 100)
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == previous
    with pytest.raises(RuntimeError, match="closed"):
        run.start()

    # the end of the block is the end of the run: exit 0
    with pytest.raises(SystemExit) as exc:
        with ElasticRun.from_env(local_env(tmp_path), timeout_s=10, hard_exit=False) as run:
            assert run.load_checkpoint()["samples_done"] == run.samples_done > 256
    assert exc.value.code == 0 and not torch.distributed.is_initialized()


def test_peer_loss_classification(torch):
    import torch.distributed as dist

    assert is_peer_loss(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                                     "waiting 5000ms for recv operation to complete"))
    assert is_peer_loss(RuntimeError("Connection closed by peer [10.0.0.3]:4242"))
    assert is_peer_loss(dist.DistNetworkError("anything"))
    assert is_peer_loss(dist.DistBackendError("NCCL communicator was aborted"))
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert is_peer_loss(wrapped)
    assert not is_peer_loss(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_peer_loss(ValueError("Connection reset by peer"))
    assert not is_peer_loss(KeyError("x"))


# ----------------------------------------------------------------------------- units
def test_progress_reporter_reports_the_figure_of_a_checkpoint(daemon):
    """ProgressReporter's base can come from a checkpoint (samples_done=) and be set at each
    checkpoint (set_samples_done); without it, it still continues from the daemon's last
    report."""
    from offcut.client.progress import ProgressReporter

    srv, c = daemon
    t0 = time.time()
    c.report_nodes(t0, "slurm", 1, idle=["n1", "n2"])
    task = c.submit(tasks_pb2.TaskSpec(name="ck", min_nodes=1, max_nodes=2,
                                       total_work_samples=2_000.0)).task
    n = len(task.nodes)
    now = [t0 + 1]
    p = ProgressReporter(srv.address, task.task_id, n, every_s=1e9, clock=lambda: now[0],
                         samples_done=500)
    assert p.samples_done == 500.0
    p.report()
    now[0] += 10
    p.set_samples_done(1_200)
    p.add(0.0)                               # not due: nothing sent
    assert p.reports == 1 and p.samples_done == 1_200.0
    p.report()
    assert c.get_task(task.task_id).model.last_samples_done == pytest.approx(1_200.0)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="samples_done"):
            p.set_samples_done(bad)
    with pytest.raises(ValueError, match="samples_done"):
        ProgressReporter(srv.address, task.task_id, n, samples_done=-5)
    p.close()
    again = ProgressReporter(srv.address, task.task_id, n, every_s=1e9, clock=lambda: now[0])
    assert again.samples_done == pytest.approx(1_200.0)  # the daemon's last report
    now[0] += 10
    again.set_samples_done(2_000)
    assert again.report().tasks[0].state == TaskState.COMPLETED
    again.client.close()


def test_checkpoint_files_are_atomic_and_the_latest_complete_one_is_selected(torch, tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    for n in (900, 10_000, 5_000):
        path = write_checkpoint(tmp_path, n, {"n": n}, keep=2)
        assert path.name == f"ckpt-{n}.pt"
    # keep=2 keeps the two with the most samples (by number, not by name or age)
    assert [n for n, _ in checkpoint_files(tmp_path)] == [5_000, 10_000]
    assert latest_checkpoint(tmp_path) == (10_000, tmp_path / "ckpt-10000.pt")
    # a writer's leftover temporary file and foreign names are never a checkpoint
    (tmp_path / ".ckpt-99999.abc123.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "ckpt-abc.pt").write_bytes(b"")
    (tmp_path / "ckpt-20000.pt.tmp").write_bytes(b"")
    assert latest_checkpoint(tmp_path)[0] == 10_000
    assert torch.load(latest_checkpoint(tmp_path)[1], weights_only=True) == {"n": 10_000}
    # a failed write leaves no temporary file and the checkpoints as they were
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(Exception):
        write_checkpoint(tmp_path, 30_000, {"f": lambda: 0}, keep=2)   # cannot be pickled
    assert sorted(os.listdir(tmp_path)) == before
    with pytest.raises(ValueError, match="keep"):
        write_checkpoint(tmp_path, 1, {}, keep=0)
    with pytest.raises(ValueError, match="samples_done"):
        write_checkpoint(tmp_path, -1, {})


FULL = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "n1", "MASTER_PORT": "29500", "OFFCUT_CHECKPOINT_DIR": "/ckpt/t000007",
        "OFFCUT_GENERATION": "3", "OFFCUT_STOP_SIGNAL": "USR2", "OFFCUT_TASK_ID": "t000007",
        "OFFCUT_ADDRESS": "unix:///run/offcut.sock", "OFFCUT_NUM_NODES": "4",
        "OFFCUT_NODE": "n3", "OFFCUT_NODELIST": "n[1-4]", "OFFCUT_TASK_NAME": "digits"}


def test_from_env_reads_the_protocol_and_local_runs():
    env = ElasticEnv.from_env(FULL)
    assert (env.rank, env.world_size, env.generation, env.num_nodes) == (2, 4, 3, 4)
    assert (env.master_addr, env.master_port) == ("n1", 29500)
    assert env.stop_signal == signal.SIGUSR2 and env.reports_progress
    assert env.checkpoint_dir == Path("/ckpt/t000007") and env.nodelist == "n[1-4]"
    local = ElasticEnv.from_env({"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                 "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "localhost",
                                 "MASTER_PORT": "1234"}, checkpoint_dir="ck")
    assert (local.generation, local.num_nodes, local.local_rank) == (0, 2, 1)
    assert local.stop_signal == signal.SIGUSR1 and not local.reports_progress
    assert local.checkpoint_dir == Path("ck")
    assert not ElasticEnv.from_env({**FULL, "OFFCUT_ADDRESS": ""}).reports_progress
    assert parse_signal("SIGTERM") == parse_signal("15") == signal.SIGTERM
    # the peer timeout: the launcher's [slurm] peer_timeout_s, else 60 s; the collective
    # timeout follows it (twice it with nccl, whose watchdog would abort the process)
    assert env.peer_timeout_s == 60.0 and local.peer_timeout_s == 60.0
    assert ElasticEnv.from_env({**FULL, "OFFCUT_PEER_TIMEOUT_S": "12.5"}).peer_timeout_s == 12.5
    run = ElasticRun(ElasticEnv.from_env({**FULL, "OFFCUT_PEER_TIMEOUT_S": "12.5"}),
                     backend="gloo")
    assert run.timeout_s == 12.5
    assert ElasticRun(ElasticEnv.from_env(FULL), backend="nccl").timeout_s == 120.0
    assert ElasticRun(ElasticEnv.from_env(FULL), backend="nccl", timeout_s=7).timeout_s == 7.0


@pytest.mark.parametrize("change,variable", [
    ({"RANK": None}, "RANK"),
    ({"WORLD_SIZE": "four"}, "WORLD_SIZE"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
    ({"RANK": "4"}, "RANK"),
    ({"RANK": "-1"}, "RANK"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR"),
    ({"MASTER_PORT": None}, "MASTER_PORT"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    ({"LOCAL_RANK": "1"}, "LOCAL_RANK"),          # >= LOCAL_WORLD_SIZE
    ({"OFFCUT_CHECKPOINT_DIR": None}, "OFFCUT_CHECKPOINT_DIR"),
    ({"OFFCUT_GENERATION": "0"}, "OFFCUT_GENERATION"),
    ({"OFFCUT_GENERATION": "2b"}, "OFFCUT_GENERATION"),
    ({"OFFCUT_STOP_SIGNAL": "SIGNOPE"}, "OFFCUT_STOP_SIGNAL"),
    ({"OFFCUT_NUM_NODES": "0"}, "OFFCUT_NUM_NODES"),
    ({"OFFCUT_PEER_TIMEOUT_S": "0"}, "OFFCUT_PEER_TIMEOUT_S"),
    ({"OFFCUT_PEER_TIMEOUT_S": "nan"}, "OFFCUT_PEER_TIMEOUT_S"),
    ({"OFFCUT_PEER_TIMEOUT_S": "1e9"}, "OFFCUT_PEER_TIMEOUT_S"),
    ({"OFFCUT_PEER_TIMEOUT_S": "soon"}, "OFFCUT_PEER_TIMEOUT_S"),
])
def test_from_env_names_the_missing_or_malformed_variable(change, variable):
    env = {k: v for k, v in {**FULL, **change}.items() if v is not None}
    with pytest.raises(ValueError) as exc:
        ElasticRun.from_env(env)
    assert str(exc.value).startswith(variable + " ")


def test_run_arguments_are_checked(tmp_path):
    env = ElasticEnv.from_env(local_env(tmp_path))
    for kw, word in (({"timeout_s": 0}, "timeout_s"), ({"keep": 0}, "keep"),
                     ({"backend": "mpi"}, "backend"), ({"checkpoint_every_steps": 0},
                                                       "checkpoint_every_steps"),
                     ({"rendezvous_timeout_s": float("inf")}, "rendezvous_timeout_s")):
        with pytest.raises(ValueError, match=word):
            ElasticRun(env, **kw)
    with pytest.raises(RuntimeError, match="start"):
        ElasticRun(env).should_stop()
