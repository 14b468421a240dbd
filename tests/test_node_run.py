"""The per-node supervisor of a job's processes (offcut.slurm_plugin.node_run;
docs/execution.md, "Processes per node"), run as the batch script runs it: real processes,
real signals, no Slurm (tests/test_elastic_slurm_procs.py runs it under the real cluster)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offcut.slurm_plugin.node_run import (FAILURE_FILE, MAX_NOTE_BYTES, TAIL_LINE_CHARS,
                                          TAIL_LINES, StderrTail, failure_note,
                                          process_environment, run_outcome)

from daemon_helpers import wait_until

#: a child: writes its pid and environment, then does what MODE says
CHILD = r'''
import json, os, signal, sys, time
out, mode = sys.argv[1], sys.argv[2]
rank = os.environ["LOCAL_RANK"]
keys = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "OFFCUT_LOCAL_GPUS", "MASTER_ADDR")
def ready():
    tmp = f"{out}/{rank}.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), **{k: os.environ.get(k) for k in keys}}, f)
    os.replace(tmp, f"{out}/{rank}.json")
def wait_all():  # every process started (the supervisor stops the rest after a failure)
    while not all(os.path.exists(f"{out}/{i}.json")
                  for i in range(int(os.environ["LOCAL_WORLD_SIZE"]))):
        time.sleep(0.02)
if mode == "stop":
    def on_stop(signum, frame):
        print(f"local rank {rank} got {signal.Signals(signum).name}", flush=True)
        os._exit(75)
    signal.signal(signal.SIGUSR1, on_stop)
    ready()
    while True:
        time.sleep(0.05)
elif mode == "crash1":
    ready()
    if rank == "1":
        wait_all()
        os._exit(3)
    while True:
        time.sleep(0.05)
elif mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready()
    if rank == "1":
        wait_all()
        os._exit(1)
    while True:
        time.sleep(0.05)
elif mode == "sleep":
    ready()
    while True:
        time.sleep(0.05)
elif mode == "abort1":
    ready()
    if rank == "1":
        wait_all()
        os.kill(os.getpid(), signal.SIGABRT)
    while True:
        time.sleep(0.05)
elif mode.startswith("noisy"):  # noisyN: 50 numbered lines on stderr, then exit N
    ready()
    for i in range(1, 51):
        print(f"rank {rank} line {i} of 50", file=sys.stderr, flush=True)
    print("x" * 5000, "\x1b]0;title\x07", file=sys.stderr, flush=True)  # long, with controls
    print("RuntimeError: boom 42", file=sys.stderr, flush=True)
    os._exit(int(mode[5:]))
else:
    ready()
    os._exit(int(mode))
'''


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


class Supervised:
    """``python -m offcut.slurm_plugin.node_run`` over CHILD in ``mode``."""

    def __init__(self, tmp: Path, mode: str, procs: int = 2, node_rank: int = 1,
                 num_nodes: int = 3, gpus_per_proc: int = 0, kill_after_s: float = 10.0,
                 checkpoint_dir: Path | None = None, job_id: str = "4711"):
        self.dir = tmp
        script = tmp / "child.py"
        script.write_text(CHILD)
        line = f"{sys.executable} {script} {tmp} {mode}"
        env = {**os.environ, "MASTER_ADDR": "n1", "SLURM_JOB_ID": job_id}
        self.procs = procs
        ckpt = ["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "offcut.slurm_plugin.node_run", "--procs", str(procs),
             "--node-rank", str(node_rank), "--num-nodes", str(num_nodes),
             "--gpus-per-proc", str(gpus_per_proc), "--kill-after-s", str(kill_after_s),
             "--stop-signal", "USR1", *ckpt, "--", line],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def children(self, timeout: float = 60) -> dict[int, dict]:
        wait_until(lambda: all((self.dir / f"{i}.json").exists() for i in range(self.procs)),
                   "every process to start", timeout)
        return {i: json.loads((self.dir / f"{i}.json").read_text()) for i in range(self.procs)}

    def end(self, timeout: float = 60) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out


def test_outcome_is_the_first_failure_else_75_else_0():
    assert run_outcome([0, 0]) == 0
    assert run_outcome([75, 0, 75]) == 75
    assert run_outcome([75, 1, -9]) == 1          # the crash, not the peers it took down
    assert run_outcome([0, -6, 3]) == -6          # a signal is a failure
    assert run_outcome([]) is None


def test_every_process_gets_its_rank_and_gpus():
    env = process_environment({"X": "1"}, local_rank=2, procs=4, node_rank=3, num_nodes=5,
                              gpus_per_proc=2)
    assert env["X"] == "1"
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == \
        ("14", "2", "4", "20")
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["OFFCUT_LOCAL_GPUS"]) == \
        ("3", "5", "4,5")
    assert process_environment({}, local_rank=0, procs=1, node_rank=0, num_nodes=1,
                               gpus_per_proc=0)["OFFCUT_LOCAL_GPUS"] == ""


def test_all_exit_0_is_0_with_torchrun_variables(tmp_path):
    run = Supervised(tmp_path, "0", procs=3, node_rank=1, num_nodes=2, gpus_per_proc=1)
    seen = run.children()
    rc, out = run.end()
    assert rc == 0, out
    assert {i: (c["RANK"], c["LOCAL_RANK"], c["LOCAL_WORLD_SIZE"], c["WORLD_SIZE"],
                c["GROUP_RANK"], c["OFFCUT_LOCAL_GPUS"], c["MASTER_ADDR"])
            for i, c in seen.items()} == {
        0: ("3", "0", "3", "6", "1", "0", "n1"),
        1: ("4", "1", "3", "6", "1", "1", "n1"),
        2: ("5", "2", "3", "6", "1", "2", "n1")}


def test_the_stop_signal_reaches_every_process_and_the_node_exits_75(tmp_path):
    run = Supervised(tmp_path, "stop", procs=3)
    kids = run.children()
    run.proc.send_signal(signal.SIGUSR1)
    rc, out = run.end()
    assert rc == 75, out
    for i in range(3):
        assert f"local rank {i} got SIGUSR1" in out
    assert not any(alive(c["pid"]) for c in kids.values())


def test_a_crash_of_local_rank_1_fails_the_run_and_stops_the_others(tmp_path):
    run = Supervised(tmp_path, "crash1", procs=3)
    kids = run.children()
    rc, out = run.end()
    assert rc == 3, out
    assert "local rank 1 failed (exit 3)" in out
    assert not any(alive(c["pid"]) for c in kids.values())


def test_a_process_that_ignores_sigterm_is_killed_after_the_bound(tmp_path):
    run = Supervised(tmp_path, "stubborn", procs=2, kill_after_s=1.0)
    kids = run.children()
    t0 = time.monotonic()
    rc, out = run.end()
    assert rc == 1, out
    assert not alive(kids[0]["pid"])
    assert time.monotonic() - t0 < 30


def test_a_process_killed_by_a_signal_ends_the_node_by_that_signal(tmp_path):
    run = Supervised(tmp_path, "abort1", procs=2)
    kids = run.children()
    rc, out = run.end()
    assert rc == -signal.SIGABRT, out  # as Slurm would record a single process aborting
    assert not alive(kids[0]["pid"])


def test_nothing_outlives_a_killed_supervisor(tmp_path):
    run = Supervised(tmp_path, "sleep", procs=2)
    kids = run.children()
    run.proc.kill()
    run.end()
    wait_until(lambda: not any(alive(c["pid"]) for c in kids.values()),
               "the processes to die with their supervisor", 30)


@pytest.mark.parametrize("args,message", [
    (["--procs", "0", "--node-rank", "0", "--num-nodes", "1", "--", "true"], "--procs"),
    (["--procs", "1", "--node-rank", "2", "--num-nodes", "2", "--", "true"], "--node-rank"),
    (["--procs", "1", "--node-rank", "0", "--num-nodes", "1"], "no command"),
])
def test_bad_arguments_are_refused_with_the_option_named(args, message):
    r = subprocess.run([sys.executable, "-m", "offcut.slurm_plugin.node_run", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr


def test_a_failed_process_leaves_its_last_stderr_lines_in_the_checkpoint_folder(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = Supervised(tmp_path, "noisy3", procs=1, checkpoint_dir=ckpt, job_id="4711")
    rc, out = run.end()
    assert rc == 3, out
    # the job's output still has every line, in order
    positions = [out.index(f"rank 0 line {i} of 50\n") for i in range(1, 51)]
    assert positions == sorted(positions) and "RuntimeError: boom 42" in out
    assert "x" * 5000 in out and "\x1b]0;title\x07" in out  # relayed unchanged
    note = ckpt / FAILURE_FILE
    assert note.stat().st_mode & 0o777 == 0o600
    lines = note.read_text().splitlines()
    assert lines[0] == "job 4711 local rank 0 exit 3"
    # the last 20 lines, the long one cut to 300 characters (controls are kept as written:
    # the launcher escapes them)
    assert len(lines) == 1 + TAIL_LINES
    assert lines[-1] == "RuntimeError: boom 42"
    assert lines[-2] == "x" * TAIL_LINE_CHARS
    assert lines[1:-2] == [f"rank 0 line {i} of 50" for i in range(33, 51)]
    assert not list(ckpt.glob(".*.tmp"))


def test_a_process_that_exits_75_leaves_no_failure_note(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = Supervised(tmp_path, "noisy75", procs=2, checkpoint_dir=ckpt)
    rc, out = run.end()
    assert rc == 75, out
    assert "rank 1 line 50 of 50" in out and "rank 0 line 50 of 50" in out
    assert ckpt.is_dir() and not (ckpt / FAILURE_FILE).exists()


def test_a_command_that_cannot_start_leaves_the_shells_words(tmp_path):
    ckpt = tmp_path / "ckpt"
    r = subprocess.run([sys.executable, "-m", "offcut.slurm_plugin.node_run", "--procs", "1",
                        "--node-rank", "0", "--num-nodes", "1", "--checkpoint-dir", str(ckpt),
                        "--", "/nonexistent/python3", "train.py"],
                       env={**os.environ, "SLURM_JOB_ID": "12"}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 127 and "No such file or directory" in r.stderr
    lines = (ckpt / FAILURE_FILE).read_text().splitlines()
    assert lines[0] == "job 12 local rank 0 exit 127"
    assert "/nonexistent/python3: No such file or directory" in lines[-1]


def test_the_kept_lines_are_bounded_and_a_carriage_return_ends_a_line():
    tail = StderrTail(-1, -1, None)
    tail.feed(b"10%\r20%\r30%")
    tail.feed(b"\r\n" + b"y" * 100_000)
    tail.feed(b"y" * 100_000 + b"\nlast\xff")
    tail._end_line()
    assert list(tail.lines) == ["10%", "20%", "30%", "y" * TAIL_LINE_CHARS, "last\ufffd"]
    tail.feed(b"".join(b"l%d\n" % i for i in range(1000)))
    assert list(tail.lines) == [f"l{i}" for i in range(980, 1000)]
    big = failure_note("7", 0, -6, ["\u00e9" * TAIL_LINE_CHARS] * TAIL_LINES)
    assert big.startswith(b"job 7 local rank 0 exit 134\n") and len(big) <= MAX_NOTE_BYTES
