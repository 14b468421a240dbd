"""Power limits of placed tasks on the training side (offcut.client.training: zeusd.py,
ranks.py, power.py; docs/execution.md, "Power limits").

Real parts: the privileged power helper (slurm_plugin/power_helper.py: its HTTP server on a
unix socket, with its recording stand-in of fake GPUs instead of NVML, since no GPU is here),
a real daemon hosting the power-limit optimizer, and, in the slow test, real PyTorch processes
(gloo on 127.0.0.1) training examples/elastic_digits. What is shown:

- both clients of the helper's API (Offcut's stdlib one and Zeus's own ``ZeusdClient``) set,
  read and measure through it; refusals and an unreachable helper are clear errors;
- :class:`HelperBackend` maps the framework's GPU indices to the helper's and sets limits
  without root; :func:`default_backend` picks it when ``ZEUSD_SOCK_PATH`` is set;
- every rank of a generation sets the daemon's planned limit on its own GPU, a profiling
  window is measured over all ranks (time: the slowest, energy: the sum), a window cut short
  by a stop is measured again by the next generation while the windows already measured are
  not, and once the optimizer has chosen, the next generation starts at the chosen limit.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from offcut.client.training import (BackendUnavailable, HelperBackend, ManualBackend,
                                    PowerHelperError, PowerLimitError, PowerLimitFollower,
                                    RankSyncError, TrainingSetupError, ZeusTraining,
                                    ZeusdHttpClient, connect_helper, default_backend,
                                    node_gpu_ids)
from offcut.client.training import backends as backends_module
from offcut.slurm_plugin.gpu_backends import StandInBackend, write_stand_in
from offcut.slurm_plugin.job_gpus import JobGpus
from offcut.slurm_plugin.power_helper import PowerHelper, PowerHelperServer, PowerRecords
from offcut.v1 import zeus_pb2

from daemon_helpers import Clock
from elastic_helpers import EXAMPLE, SIGNAL_AT_SAMPLES, Rank, free_port, rank_env

MIN_MW, MAX_MW, DEFAULT_MW = 100_000, 300_000, 300_000
#: the fake GPUs of the node: the job holds 0 and 1; 2 is another job's
NODE_GPUS = 3
JOB_GPUS = frozenset({0, 1})


# ----------------------------------------------------------------------------- the helper
class FakeJobs:
    """The helper's view of Slurm without Slurm: every process is in job 7, which holds
    GPUs 0 and 1 of node n1 (root may use every GPU anyway)."""

    def job_of(self, pid):
        return "7"

    def job(self, job_id):
        return JobGpus(job_id, os.getuid(), "RUNNING", {"n1": JOB_GPUS}) if job_id == "7" else None

    def forget(self, job_id):
        pass


@pytest.fixture
def helper():
    """The real power helper on a unix socket in a folder root owns (as it requires), with
    the recording stand-in of ``NODE_GPUS`` fake GPUs (100-300 W, default 300 W). Yields
    (socket path, stand-in backend)."""
    d = Path(tempfile.mkdtemp(prefix="offcut-plo-", dir="/tmp"))
    d.chmod(0o755)
    stand_in = write_stand_in(d / "gpus.json", [
        {"name": f"Stand-in {i}", "min_power_limit_mw": MIN_MW, "max_power_limit_mw": MAX_MW,
         "default_power_limit_mw": DEFAULT_MW} for i in range(NODE_GPUS)])
    backend = StandInBackend(stand_in)
    server = PowerHelperServer(PowerHelper(backend, FakeJobs(), "n1",
                                           PowerRecords(d / "records.json")),
                               str(d / "run" / "power.sock")).start()
    try:
        yield server.socket_path, backend
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(d)], check=False)


def sets_by_gpu(stand_in: StandInBackend, since: int = 0) -> dict[int, list[float]]:
    """The limits [W] set on each fake GPU, in order, from the ``since``-th recorded call."""
    out: dict[int, list[float]] = {}
    for call in stand_in.calls()[since:]:
        out.setdefault(call["gpu"], []).append(call["power_limit_mw"] / 1000)
    return out


# ----------------------------------------------------------------------------- clients
@pytest.mark.parametrize("use_zeus", [False, True], ids=["stdlib", "zeus"])
def test_both_clients_set_read_and_measure_through_the_helper(helper, use_zeus):
    """Offcut's stdlib client and Zeus's ``ZeusdClient`` (zeus installed) speak the helper's
    API alike: discovery, constraints [mW], a set the fake GPU records with the caller's pid,
    read-back, energy counters; a limit outside the GPU's range is the helper's 400, named."""
    if use_zeus:
        pytest.importorskip("zeus.utils.zeusd", reason="zeus is not installed")
    sock, stand_in = helper
    client = connect_helper(sock, use_zeus=use_zeus)
    assert type(client).__name__ == ("ZeusClientAdapter" if use_zeus else "ZeusdHttpClient")
    assert client.gpu_ids == [0, 1, 2]
    assert client.get_power_limit_constraints([0, 1]) == {0: (MIN_MW, MAX_MW),
                                                          1: (MIN_MW, MAX_MW)}
    client.set_power_limit([1], 175_000, True)
    assert client.get_power_limit([0, 1]) == {0: DEFAULT_MW, 1: 175_000}
    [call] = stand_in.calls()
    assert call["gpu"] == 1 and call["power_limit_mw"] == 175_000
    assert f"pid {os.getpid()} job 7" in call["by"]
    energy = client.get_gpu_energy([0, 1])
    assert set(energy) == {0, 1} and all(v >= 0 for v in energy.values())
    with pytest.raises(PowerHelperError, match=r"power_limit_mw: 50000 mW is outside GPU 0's "
                                               r"range \[100000, 300000\]") as err:
        client.set_power_limit([0], 50_000, True)
    if not use_zeus:  # (Zeus's client keeps the text, not the status)
        assert err.value.status == 400
    assert stand_in.limits() == [DEFAULT_MW, 175_000, DEFAULT_MW]


def test_an_unreachable_or_unset_helper_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    with pytest.raises(BackendUnavailable, match="ZEUSD_SOCK_PATH is not set"):
        connect_helper()
    with pytest.raises(BackendUnavailable, match="ZEUSD_SOCK_PATH is not set"):
        HelperBackend([0], measure=ManualBackend())
    with pytest.raises(PowerHelperError, match="cannot reach the power helper at .*nothing.sock"):
        ZeusdHttpClient(str(tmp_path / "nothing.sock"))
    # a backend reaches its helper only when a limit is set or read
    backend = HelperBackend([0], measure=ManualBackend(), socket_path=str(tmp_path / "no.sock"),
                            use_zeus=False)
    with pytest.raises(PowerLimitError, match="cannot set the power limit of GPU \\[0\\] to "
                                              "150 W through the power helper") as err:
        backend.set_power_limit(150.0)
    assert (err.value.gpu_index, err.value.power_limit_w) == (0, 150.0)


def test_answers_not_of_zeusds_shape_are_refused_by_name(tmp_path):
    """A server on the socket that is not zeusd (or a broken one): every malformed answer
    is a PowerHelperError saying what was wrong, never a KeyError or a wrong figure."""
    import http.server
    import socketserver

    answers = {"/discover": b'{"gpus": [{"id": 0}, {"id": 1}]}',
               "/gpu/get_power_limit": b'{"0": {"power_limit_mw": "lots"}}',
               "/gpu/get_power_limit_constraints": b'{"zero": {}}',
               "/gpu/get_cumulative_energy": b"not json"}

    class Handler(http.server.BaseHTTPRequestHandler):
        def address_string(self):
            return "test"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            body = answers.get(self.path.split("?")[0], b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    path = str(tmp_path / "bad.sock")
    server = Server(path, Handler)
    threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True).start()
    try:
        client = ZeusdHttpClient(path)
        assert client.gpu_ids == [0, 1]
        with pytest.raises(PowerHelperError, match="non-integer power_limit_mw: 'lots'"):
            client.get_power_limit([0])
        with pytest.raises(PowerHelperError, match="names GPU 'zero'"):
            client.get_power_limit_constraints([0])
        with pytest.raises(PowerHelperError, match="is not JSON"):
            client.get_gpu_energy([0])
        with pytest.raises(PowerHelperError, match=r"HTTP 404"):
            client._request("GET", "/nothing")
        answers["/discover"] = b'{"gpus": "none"}'
        with pytest.raises(PowerHelperError, match="without a list of GPUs"):
            ZeusdHttpClient(path)
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- the backend
def test_gpu_indices_map_to_the_helpers_ids_as_zeus_maps_them(monkeypatch):
    """The framework's index i is CUDA_VISIBLE_DEVICES' i-th entry (the node's NVML index);
    without the variable, the index itself; MIG slices and indices beyond the list are
    refused by name."""
    assert node_gpu_ids([1], {}) == [1] and node_gpu_ids(None, {}) is None
    env = {"CUDA_VISIBLE_DEVICES": "2, 0"}
    assert node_gpu_ids([0], env) == [2] and node_gpu_ids(None, env) == [2, 0]
    with pytest.raises(BackendUnavailable, match="GPU index 2 is not among the 2 GPUs"):
        node_gpu_ids([2], env)
    with pytest.raises(BackendUnavailable, match="MIG slice"):
        node_gpu_ids([0], {"CUDA_VISIBLE_DEVICES": "MIG-1234"})
    with pytest.raises(BackendUnavailable, match="cannot parse"):
        node_gpu_ids([0], {"CUDA_VISIBLE_DEVICES": "gpu0"})


def test_the_helper_backend_sets_this_processs_gpus_without_root(helper, monkeypatch):
    """HelperBackend([0]) with CUDA_VISIBLE_DEVICES=1,0 acts on the node's GPU 1 only: its
    range comes from the helper, a set reaches that fake GPU (and a ManualBackend measure
    follows it), a GPU the helper does not have is refused before any set; with
    ``measure="helper"`` the windows read the helper's energy counters, which grow with the
    limit; :func:`default_backend` wraps the measuring backend in it when ZEUSD_SOCK_PATH is
    set."""
    sock, stand_in = helper
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    measure = ManualBackend(power_w=lambda w: w / 2)
    backend = HelperBackend([0], measure=measure, socket_path=sock)
    assert backend.node_ids == [1] and backend.num_gpus == 1
    assert backend.power_limit_range() == (100.0, 300.0)
    backend.set_power_limit(212.5)
    assert stand_in.limits() == [DEFAULT_MW, 212_500, DEFAULT_MW]
    assert backend.power_limits_w() == {1: 212.5} and measure.power_limit_w == 212.5
    assert backend.limits_set == [212.5]
    with pytest.raises(PowerLimitError, match=r"outside GPU 1's range"):
        backend.set_power_limit(400.0)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(PowerLimitError, match=r"does not offer GPU \[7\]"):
        HelperBackend([0], measure=ManualBackend(), socket_path=sock).set_power_limit(200.0)
    assert len(stand_in.calls()) == 1

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    metered = HelperBackend([0, 1], measure="helper", socket_path=sock)
    metered.set_power_limit(100.0)
    metered.begin_window("low")
    wait_for_energy(metered, "low")
    metered.set_power_limit(300.0)
    metered.begin_window("high")
    wait_for_energy(metered, "high")

    monkeypatch.setattr(backends_module, "measuring_backend", lambda gpus=None: measure)
    monkeypatch.delenv("ZEUSD_SOCK_PATH", raising=False)
    assert default_backend([0]) is measure
    monkeypatch.setenv("ZEUSD_SOCK_PATH", sock)
    chosen = default_backend([1])
    assert isinstance(chosen, HelperBackend) and chosen.measure is measure
    assert chosen.node_ids == [1] and chosen.socket_path == sock


def wait_for_energy(backend: HelperBackend, name: str) -> None:
    """A window of the helper's counters measures about 0.75 x limit x GPUs [W] (the
    stand-in's draw) once some time has passed."""
    import time

    end = time.monotonic() + 30
    while True:
        time.sleep(0.05)
        t, e = backend.end_window(name)
        watts = backend.power_limits_w()
        expected = 0.75 * sum(watts.values()) * t
        if e > 0 and abs(e - expected) <= 0.05 * expected + 0.01:
            return
        assert time.monotonic() < end, (name, t, e, expected)
        backend.begin_window(name)


# ----------------------------------------------------------------------------- ranks, in threads
#: the limits profiled (spec: 300 W down to 100 W in 100 W steps, selector "energy"), each
#: rank's modelled draw at each [W] (rank 1 draws half of rank 0's) and the time of one step
#: at each [s]: energy per step 2.5, 1.8, 2.4 (x 1.5) J: the optimizer chooses 200 W
DRAW_W = {300.0: 250.0, 200.0: 150.0, 100.0: 120.0}
STEP_S = {300.0: 0.010, 200.0: 0.012, 100.0: 0.020}
SHARE = (1.0, 0.5)
WARMUP, PROFILE = 2, 3


def power_job(job_id: str) -> zeus_pb2.BatchSizeJobSpec:
    spec = zeus_pb2.BatchSizeJobSpec(job_id=job_id, batch_sizes=[64], default_batch_size=64,
                                     eta_knob=0.5, max_epochs=50, target_metric=2.0,
                                     higher_is_better=True, max_power_w=600.0, seed=1)
    spec.power.CopyFrom(zeus_pb2.PowerLimitSpec(
        min_power_limit_w=100, max_power_limit_w=300, step_w=100, warmup_steps=WARMUP,
        profile_steps=PROFILE, selector="energy"))
    return spec


class Hub:
    """The collectives of ranks that run in threads of this process."""

    def __init__(self, world: int):
        self.barrier = threading.Barrier(world, timeout=60)
        self.slot: list[float] = []
        self.windows: list[tuple[float, float]] = [(0.0, 0.0)] * world


class ThreadSync:
    """A :class:`~offcut.client.training.RankSync` over a :class:`Hub`; counts its calls."""

    def __init__(self, hub: Hub, rank: int):
        self.hub, self.rank, self.world_size = hub, rank, len(hub.windows)
        self.calls: list[str] = []

    def share(self, values, length):
        self.calls.append("share")
        if self.rank == 0:
            self.hub.slot = list(values)
        self.hub.barrier.wait()
        out = list(self.hub.slot)
        assert len(out) == length
        self.hub.barrier.wait()
        return out

    def reduce_window(self, time_s, energy_j):
        self.calls.append("reduce")
        self.hub.windows[self.rank] = (time_s, energy_j)
        self.hub.barrier.wait()
        times, energies = zip(*self.hub.windows)
        self.hub.barrier.wait()
        return max(times), sum(energies)


def run_rank(rank: int, hub: Hub, sock: str, address: str, job_id: str, generation: int,
             trial: int | None, steps: int) -> tuple[int, list[str]]:
    """One rank of one generation: epochs of 30 steps (each advancing the rank's clock by the
    step time at the current limit); after ``steps`` steps the stop comes: rank 0 suspends the
    trial (ZeusTraining.interrupt), the others close. Returns (trial, the collectives made)."""
    clock = Clock()
    measure = ManualBackend(clock=clock, power_w=lambda w: DRAW_W[w] * SHARE[rank],
                            power_limit_range_w=(100.0, 300.0))
    power = HelperBackend([rank], measure=measure, socket_path=sock, use_zeus=False)
    sync = ThreadSync(hub, rank)
    if rank == 0:
        hooks = ZeusTraining(address, job_id, resume_trial=trial, generation=generation,
                             backend=ManualBackend(clock=clock, power_w=1.0),
                             power_backend=power, sync=sync)
        trial = hooks.trial_number
    else:
        hooks = PowerLimitFollower(power, sync)
    done = 0
    while True:
        hooks.on_epoch_begin()
        for _ in range(30):
            hooks.on_step_begin()
            clock.t += STEP_S[measure.power_limit_w]
            done += 1
            if done == steps:
                hooks.interrupt()
                return trial, sync.calls
        if rank == 0:
            hooks.on_epoch_end(0.5)
        else:
            hooks.on_epoch_end()


def run_generation(sock, address, job_id, generation, trial, steps):
    hub = Hub(2)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run_rank, r, hub, sock, address, job_id, generation, trial, steps)
                   for r in range(2)]
        (trial, calls0), (_, calls1) = [f.result(timeout=120) for f in futures]
    assert calls0 == calls1  # the ranks took the same collectives, in the same order
    return trial


def test_every_rank_sets_the_plan_and_a_stopped_profile_resumes_in_the_next_generation(
        helper, daemon, monkeypatch):
    """Two ranks (threads, each with its own GPU of the helper's stand-in) over three
    generations of one trial. Generation 1 measures the window at 300 W and is stopped in
    the middle of the one at 200 W; generation 2 measures 200 W and 100 W only (300 W's figures
    stay as generation 1 reported them) and the optimizer chooses 200 W; generation 3 starts
    at 200 W. Each window's time is the ranks' (equal) time and its energy the sum of both
    ranks' energies; every rank sets the same limits, on its own GPU only."""
    sock, stand_in = helper
    srv, client = daemon
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # rank r: the node's GPU r
    client.register_zeus_job(power_job("pj"))

    # generation 1: wait 2 steps, warm-up at 300 W, window 300 W (steps 4-6), warm-up and
    # window at 200 W from step 9; stopped after step 10
    trial = run_generation(sock, srv.address, "pj", 1, None, 10)
    profile = client.power_profile("pj", 64)
    [m] = profile.measurements
    window_300 = (m.time_s, m.energy_j)
    assert m.power_limit_w == 300.0 and window_300 == pytest.approx(
        (PROFILE * STEP_S[300.0], PROFILE * STEP_S[300.0] * DRAW_W[300.0] * sum(SHARE)))
    assert not profile.done
    assert client.power_plan("pj", 64).power_limit_w == 200.0   # the interrupted window
    first = sets_by_gpu(stand_in)
    # each rank: the maximum at the start, 200 W's warm-up, the maximum again at the stop
    assert first == {0: [300.0, 200.0, 300.0], 1: [300.0, 200.0, 300.0]}

    # generation 2 resumes the trial and the profile: 200 W and 100 W measured, 300 W kept
    calls = len(stand_in.calls())
    assert run_generation(sock, srv.address, "pj", 2, trial, 15) == trial
    profile = client.power_profile("pj", 64)
    figures = {m.power_limit_w: (m.time_s, m.energy_j) for m in profile.measurements}
    assert list(figures) == [300.0, 200.0, 100.0] and figures[300.0] == window_300
    for watts in (200.0, 100.0):
        t = PROFILE * STEP_S[watts]
        assert figures[watts] == pytest.approx((t, t * DRAW_W[watts] * sum(SHARE)))
    assert profile.done and profile.chosen_power_limit_w == 200.0
    assert sets_by_gpu(stand_in, calls) == {g: [300.0, 200.0, 100.0, 200.0, 300.0]
                                            for g in (0, 1)}

    # generation 3: the chosen limit from the start, on both GPUs
    calls = len(stand_in.calls())
    run_generation(sock, srv.address, "pj", 3, trial, 5)
    assert sets_by_gpu(stand_in, calls) == {0: [200.0, 300.0], 1: [200.0, 300.0]}
    assert 2 not in sets_by_gpu(stand_in)  # the GPU the job does not hold: never touched
    assert client.get_zeus_job("pj").trials[0].interruptions == 3


def test_a_failure_of_rank_0_reaches_the_followers_instead_of_a_hang(helper, daemon,
                                                                    monkeypatch):
    """Rank 0 cannot get the plan (the job is unknown to the daemon at the first plan): it
    raises the daemon's error, and the follower raises RankSyncError at the same step instead
    of waiting for a plan; a follower whose rank 0 profiles but which has no backend refuses
    clearly; ZeusTraining refuses a sync whose rank is not 0."""
    sock, _ = helper
    srv, client = daemon
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    client.register_zeus_job(power_job("gone"))
    hub = Hub(2)
    power0 = HelperBackend([0], measure=ManualBackend(), socket_path=sock)
    zt = ZeusTraining(srv.address, "gone", backend=ManualBackend(), power_backend=power0,
                      sync=ThreadSync(hub, 0))
    client.delete_zeus_job("gone")

    def follower():
        f = PowerLimitFollower(None, ThreadSync(hub, 1))
        with pytest.raises(RankSyncError, match="rank 0 could not get the daemon's power plan"):
            f.on_epoch_begin()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(follower)
        with pytest.raises(Exception, match="gone"):
            zt.on_epoch_begin()
        fut.result(timeout=60)
    zt.close(end_trial=False)

    client.register_zeus_job(power_job("pj"))
    hub = Hub(2)
    zt = ZeusTraining(srv.address, "pj", backend=ManualBackend(), power_backend=power0,
                      sync=ThreadSync(hub, 0))

    def bare_follower():
        with pytest.raises(TrainingSetupError, match="no power-limit backend"):
            PowerLimitFollower(None, ThreadSync(hub, 1)).on_epoch_begin()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(bare_follower)
        zt.on_epoch_begin()
        fut.result(timeout=60)
    zt.close()
    with pytest.raises(TrainingSetupError, match="runs on rank 0"):
        ZeusTraining(srv.address, "pj", backend=ManualBackend(), sync=ThreadSync(Hub(2), 1))
    with pytest.raises(ValueError, match="rank 0 talks to the daemon"):
        PowerLimitFollower(None, ThreadSync(Hub(2), 0))


# ----------------------------------------------------------------------------- real processes
#: the example's arguments: checkpoints only at Zeus epochs and stops, steps paced to 20 ms so
#: that every window's time is about the same and the stand-in's energy (0.75 x limit x time)
#: decides
EXAMPLE_ARGS = ["--checkpoint-every-s", "0", "--zeus-power-w", "100", "--min-step-s", "0.02",
                "--collective-timeout-s", "60"]
PID = re.compile(r"\bpid (\d+)\b")


def example_job(job_id: str) -> zeus_pb2.BatchSizeJobSpec:
    """Batch size 64 only (3 Zeus epochs of 24 steps to 93 %), power limits 300, 200, 100 W
    (warm-up 2 steps, window 3), the least energy chosen."""
    spec = zeus_pb2.BatchSizeJobSpec(job_id=job_id, batch_sizes=[64], default_batch_size=64,
                                     eta_knob=0.5, beta_knob=1000.0, max_epochs=20,
                                     target_metric=0.93, higher_is_better=True,
                                     max_power_w=600.0, seed=7)
    spec.power.CopyFrom(zeus_pb2.PowerLimitSpec(
        min_power_limit_w=100, max_power_limit_w=300, step_w=100, warmup_steps=WARMUP,
        profile_steps=PROFILE, selector="energy"))
    return spec


def start_generation(number: int, ckdir: Path, logs: Path, extra: dict[str, str],
                     signal_at: int | None) -> list[Rank]:
    """Both processes of one node (LOCAL_RANK 0 and 1 of 2, GPUs 0 and 1 visible); with
    ``signal_at``, rank 1 sends itself the stop signal at that many samples."""
    port = free_port()
    script = ["-c", SIGNAL_AT_SAMPLES] if signal_at is not None else [str(EXAMPLE)]
    ranks = []
    for r in range(2):
        env_extra = dict(extra, LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", OFFCUT_NUM_NODES="1",
                         CUDA_VISIBLE_DEVICES="0,1")
        if signal_at is not None:
            env_extra.update(OFFCUT_TEST_SIGNAL_AT=str(signal_at), OFFCUT_TEST_SIGNAL_RANK="1",
                             OFFCUT_TEST_SIGNAL="")
        ranks.append(Rank([sys.executable, *script, *EXAMPLE_ARGS],
                          rank_env(r, 2, port, ckdir, generation=number, extra=env_extra),
                          logs, f"gen{number}-rank{r}"))
    return ranks


@pytest.mark.slow
def test_the_optimizers_limit_reaches_every_process_of_every_generation(helper, daemon, example,
                                                                        tmp_path):
    """The digits example under a power-limit job, 2 processes of one node (one per fake GPU)
    through the real helper, 3 generations of one task run: generation 1 gets the stop signal
    in the middle of the window at 200 W (after the one at 300 W), generation 2 measures 200 W
    and 100 W (not 300 W again) and the optimizer chooses, is stopped in the next epoch, and
    generation 3 starts at the chosen limit and trains to the target. In every generation both
    processes set the same limits, each on its own GPU (the helper's record, by pid), and GPU
    2 (not the job's) is never touched."""
    sock, stand_in = helper
    srv, client = daemon
    client.register_zeus_job(example_job("pe"))
    extra = {"OFFCUT_ADDRESS": srv.address, "OFFCUT_ZEUS_JOB_ID": "pe", "ZEUSD_SOCK_PATH": sock}
    ckdir, logs = tmp_path / "ckpt", tmp_path / "logs"
    # batch 64 = 24 steps per epoch; generation 1: wait 2 steps, 300 W warm-up (steps 2-3)
    # and window (4-6), 200 W from step 7, its window (9-11) cut by the stop at step 10
    # (640 samples); generation 2 (from 640): 200 W and 100 W measured by its step 12 (1408
    # samples), stopped at 1948 (epoch 2); generation 3 to the end
    plan = [(1, 640, [75, 75]), (2, 1900, [75, 75]), (3, None, [0, 0])]
    gens, profiles = {}, {}
    for number, signal_at, codes in plan:
        ranks = start_generation(number, ckdir, logs, extra, signal_at)
        try:
            assert [r.wait() for r in ranks] == codes, "\n".join(r.tail() for r in ranks)
        finally:
            for r in ranks:
                r.kill()
        gens[number] = ranks
        profiles[number] = client.power_profile("pe", 64)

    # the profile: generation 1 measured 300 W only, generation 2 the rest; 300 W's figures
    # are generation 1's (not measured again); the chosen limit is the least energy's
    [m300] = profiles[1].measurements
    assert m300.power_limit_w == 300.0 and not profiles[1].done
    done = profiles[2]
    assert done.done and [m.power_limit_w for m in done.measurements] == [300.0, 200.0, 100.0]
    assert (done.measurements[0].time_s, done.measurements[0].energy_j) == \
        (m300.time_s, m300.energy_j)
    chosen = done.chosen_power_limit_w
    assert chosen == min(done.measurements, key=lambda m: m.energy_j).power_limit_w
    assert list(profiles[3].measurements) == list(done.measurements)

    def windows(rank: Rank) -> list[str]:
        return re.findall(r"window at (\d+) W: ", rank.err)

    assert windows(gens[1][0]) == ["300"] and windows(gens[2][0]) == ["200", "100"]
    assert windows(gens[3][0]) == []
    for r in gens[1]:   # both processes cut the window at 200 W short at the stop
        assert "window at 200 W interrupted" in r.err, r.tail()

    # the helper's record: by pid, each process on its own GPU, the same limits in a
    # generation; the maximum at a generation's start while profiling, the chosen one after
    by_pid = {r.proc.pid: (number, rank) for number, ranks in gens.items()
              for rank, r in enumerate(ranks)}
    seen: dict[tuple[int, int], list[float]] = {}
    for call in stand_in.calls():
        number, rank = by_pid[int(PID.search(call["by"]).group(1))]
        assert call["gpu"] == rank, call
        seen.setdefault((number, rank), []).append(call["power_limit_mw"] / 1000)
    expected = {1: [300.0, 200.0, 300.0],
                2: [300.0, 200.0, 100.0] + ([chosen] if chosen != 100.0 else []) + [300.0],
                3: [chosen] + ([300.0] if chosen != 300.0 else [])}
    assert seen == {(n, r): expected[n] for n in (1, 2, 3) for r in (0, 1)}
    assert stand_in.limits()[2] == DEFAULT_MW
    print("\nwindows:", [(m.power_limit_w, round(m.time_s, 4), round(m.energy_j, 3))
                         for m in done.measurements], f"chosen {chosen:g} W;",
          "limits set per generation (each of 2 GPUs):", {n: expected[n] for n in (1, 2, 3)})

    # one trial across the generations, converged
    [trial] = client.get_zeus_job("pe").trials
    assert (trial.status, trial.interruptions, trial.generation) == ("converged", 2, 3)
