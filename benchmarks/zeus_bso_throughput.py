"""Batch-size optimizer round trips per second: offcutd (gRPC, durable) vs Zeus's own BSO server.

One round trip = predict (open a trial, get its batch size) + report one epoch that reaches the
target metric (the trial converges and ends). Each scenario registers a fresh job and runs the
loop from 1 and from ``--threads`` K client threads until ``--trials`` round trips (default
1000) or ``--seconds`` (default 60), whichever comes first; printed: round trips/s, p50/p99
latency of a round trip [ms], p50 of the first and of the last 200 round trips, and the
server's CPU time per round trip, and PASS/FAIL against the goals of docs/zeus.md,
"Storage" (:data:`GOAL_RT_PER_S` from the ``--threads`` run; p50 of the last 200 over the first
200 <= :data:`GOAL_RATIO` for runs of >= :data:`GOAL_TRIALS` round trips; first/last are in
start order across all threads). Zeus's server's per-call cost grows with the number of trials
a job has; offcutd's no longer does (a call writes O(1) rows, docs/zeus.md,
"Storage"). Compare scenarios at the same trial count: the default stops on trials, and a scenario
cut by ``--seconds`` first is flagged.

Figures of earlier runs, with the changes tried and what each was worth:
benchmarks/results/earlier-measurements.md, "Zeus round trips"; each run writes its own
(``benchmarks/results/zeus_bso_throughput-DATE-TIME.txt``, unless ``--no-results``).

- offcutd: a real daemon subprocess on a unix socket in a temporary folder with durability
  ``--durability`` (default ``full``: SQLite WAL, fsync on every commit before answering), and
  with ``--tcp`` (default on) a second one on TCP loopback. Client: ``offcut.client.Client``,
  one per thread; predictions carry a request id (retry-safe, as a real client sends).
- gRPC floor: a subprocess serving only gRPC health ``Check`` (:data:`FLOOR_SERVER`: no
  interceptors, no state, no fsync), driven by the same :func:`drive` over plain ``grpc``
  channels.
- Zeus: ``zeus.optimizer.batch_size.server.router:app`` (FastAPI) under uvicorn on 127.0.0.1,
  one worker, SQLite through aiosqlite (``ZEUS_BSO_DATABASE_URL=sqlite+aiosqlite:///...``,
  SQLite's default rollback journal with synchronous=FULL, i.e. also durable), tables created
  with ``Base.metadata.create_all`` as Zeus's own tests do, log level WARN. Driven over HTTP/1.1
  keep-alive (stdlib ``http.client``, one connection per thread): ``GET /jobs/batch_size``,
  ``POST /report`` (``--end-trial`` adds ``PATCH /trials``, and our EndTrial, to both).
  ``zeus[bso-server]`` pins pydantic<2 while offcut needs pydantic>=2, so Zeus runs from a
  SEPARATE venv (``--zeus-venv``); create it with::

      python -m venv /tmp/zeus-bso-venv
      /tmp/zeus-bso-venv/bin/pip install 'zeus[bso-server]' aiosqlite greenlet

  (greenlet: SQLAlchemy 2.1's asyncio extension needs it and does not pull it in.)

Both servers and the client threads share this machine's cores; compare ratios, not absolutes.

Usage::

    python benchmarks/zeus_bso_throughput.py                        # 1000 trials per scenario, K = 4
    python benchmarks/zeus_bso_throughput.py --trials 3000 --seconds 300 --threads 8 --json out.json
    python benchmarks/zeus_bso_throughput.py --no-zeus --durability normal
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from offcut.client.api import Client
from offcut.client.child_daemon import offcutd_argv, start_offcutd, stop_offcutd
from offcut.v1 import zeus_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_log import ResultsLog, add_option  # noqa: E402 (benchmarks/results_log.py)

BATCH_SIZES = [8, 16, 32, 64, 128, 256]
DEFAULT_BS = 32
TARGET = 0.5
MAX_POWER_W = 300.0
#: offcutd's job (its ``BatchSizeJobSpec`` fields but ``job_id``): over gRPC and in-process
JOB_SPEC = dict(batch_sizes=BATCH_SIZES, default_batch_size=DEFAULT_BS, eta_knob=0.5,
                beta_knob=2.0, max_epochs=100, target_metric=TARGET, higher_is_better=True,
                max_power_w=MAX_POWER_W, seed=1)
ZEUS_VENV_HINT = ("python -m venv {venv} && {venv}/bin/pip install 'zeus[bso-server]' "
                  "aiosqlite greenlet")

# Runs inside the Zeus venv: create the tables (as Zeus's tests do), then serve the app.
ZEUS_BOOT = r"""
import asyncio, sys
import uvicorn
from zeus.optimizer.batch_size.server.database.db_connection import sessionmanager
from zeus.optimizer.batch_size.server.database.schema import Base

async def create():
    async with sessionmanager._engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    await sessionmanager._engine.dispose()  # the server's event loop opens its own connections

asyncio.run(create())
uvicorn.run("zeus.optimizer.batch_size.server.router:app", host="127.0.0.1",
            port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


@dataclass
class Result:
    server: str
    transport: str
    threads: int
    round_trips: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)  # perf_counter at each start
    not_converged: int = 0
    errors: list[str] = field(default_factory=list)
    server_cpu_s: float | None = None
    client_cpu_s: float | None = None  # this process (the client threads) while driving
    trials_goal: int | None = None

    def row(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        by_time = lat[np.argsort(np.asarray(self.started_at), kind="stable")] if len(
            self.started_at) == len(lat) else lat  # all threads' round trips, in start order
        first, last = by_time[:200], by_time[-200:]
        return {"server": self.server, "transport": self.transport, "threads": self.threads,
                "round_trips": self.round_trips, "wall_s": self.wall_s,
                "rt_per_s": self.round_trips / self.wall_s if self.wall_s else 0.0,
                "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
                "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
                "first200_p50_ms": float(np.percentile(first, 50)) if len(first) else None,
                "last200_p50_ms": float(np.percentile(last, 50)) if len(last) else None,
                "last_over_first": (float(np.percentile(last, 50) / np.percentile(first, 50))
                                    if len(first) else None),
                "server_cpu_ms_per_rt": (1e3 * self.server_cpu_s / self.round_trips
                                         if self.server_cpu_s is not None and self.round_trips
                                         else None),
                "client_cpu_ms_per_rt": (1e3 * self.client_cpu_s / self.round_trips
                                         if self.client_cpu_s is not None and self.round_trips
                                         else None),
                "not_converged": self.not_converged, "errors": len(self.errors),
                "cut_by_time": bool(self.trials_goal and self.round_trips < self.trials_goal),
                "first_error": self.errors[0] if self.errors else None}


def epoch_energy(rng: np.random.Generator) -> float:
    """The energy [J] reported for a round trip's one epoch: 1,000-1,100 J, within beta_knob
    (2) x the cheapest run, so every trial converges."""
    return 1000.0 * (1.0 + 0.1 * rng.random())


def cpu_seconds(pid: int) -> float | None:
    """utime + stime [s] of a process (Linux /proc), children excluded."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drive(result: Result, threads: int, seconds: float, max_trials: int | None,
          make_worker) -> Result:
    """Run ``threads`` workers until the deadline or ``max_trials`` round trips in total.
    ``make_worker(index)`` returns ``(round_trip() -> converged, close())``."""
    stop = threading.Event()
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)
    count = [0]

    def loop(i: int) -> None:
        try:
            round_trip, close = make_worker(i)
        except Exception as exc:  # noqa: BLE001
            with lock:
                result.errors.append(f"worker setup: {type(exc).__name__}: {exc}")
            barrier.wait()
            return
        local: list[float] = []
        starts: list[float] = []
        barrier.wait()
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = round_trip()
                except Exception as exc:  # noqa: BLE001
                    with lock:
                        result.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                    if len(result.errors) > 20:
                        stop.set()
                    continue
                local.append((time.perf_counter() - t0) * 1e3)
                starts.append(t0)
                with lock:
                    count[0] += 1
                    result.not_converged += not ok
                    if max_trials and count[0] >= max_trials:
                        stop.set()
        finally:
            close()
            with lock:
                result.latencies_ms.extend(local)
                result.started_at.extend(starts)

    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    started = time.perf_counter()
    cpu0 = time.process_time()
    stop.wait(seconds)
    stop.set()
    for w in workers:
        w.join(60)
    result.wall_s = time.perf_counter() - started
    result.client_cpu_s = time.process_time() - cpu0
    result.round_trips = count[0]
    result.trials_goal = max_trials or None
    return result


# ---------------------------------------------------------------------- offcutd
class Offcutd:
    """``offcutd`` on ``address`` with its state in ``folder``."""

    def __init__(self, address: str, folder: Path, durability: str):
        cmd = [*offcutd_argv(), "--listen", address, "--state", str(folder / "state.sqlite"),
               "--durability", durability, "--log-level", "warning"]
        if not address.startswith("unix://"):
            cmd.append("--insecure-local")  # (loopback TCP without tokens, refused otherwise)
        self.address = address
        self.proc = start_offcutd(cmd, address, folder / "offcutd.log")

    def close(self) -> None:
        """Stop the daemon (SIGTERM, SIGKILL after 30 s)."""
        stop_offcutd(self.proc)


def offcut_scenario(daemon: Offcutd, transport: str, threads: int, args) -> Result:
    job_id = f"bench-{transport}-{threads}-{uuid.uuid4().hex[:8]}"
    with Client(daemon.address) as c:
        c.register_zeus_job(zeus_pb2.BatchSizeJobSpec(job_id=job_id, **JOB_SPEC))

    def make_worker(i: int):
        client = Client(daemon.address)
        rng = np.random.default_rng(i)

        def round_trip() -> bool:
            pred = client.predict_batch_size(job_id, request_id=uuid.uuid4().hex)
            v = client.report_epoch(job_id, pred.trial_number, 1, 10.0, epoch_energy(rng), TARGET,
                                    batch_size=pred.batch_size)
            if args.end_trial or not v.finished:
                client.end_trial(job_id, pred.trial_number)
            return v.converged

        return round_trip, client.close

    result = Result("offcutd", transport, threads)
    cpu0 = cpu_seconds(daemon.proc.pid)
    drive(result, threads, args.seconds, args.trials, make_worker)
    cpu1 = cpu_seconds(daemon.proc.pid)
    result.server_cpu_s = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return result


# ---------------------------------------------------------------------- the gRPC floor
#: an empty gRPC server as offcutd serves the Zeus round trip: grpc.aio on offcutd's kind of
#: event loop (``offcut.daemon.edge.event_loop.new_loop``: uvloop where importable), the unary
#: handler a coroutine on that loop (as ``Predict`` and ``ReportEpoch``, docs/architecture.md,
#: "Threads"); it answers gRPC health ``Check`` and does nothing else (no interceptors, no
#: state, no fsync)
FLOOR_SERVER = r"""
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from offcut.daemon.edge.event_loop import new_loop

class Empty(health_pb2_grpc.HealthServicer):
    async def Check(self, request, context):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

async def serve():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(Empty(), server)
    server.add_insecure_port(sys.argv[1])
    await server.start()
    await server.wait_for_termination()

loop, _ = new_loop()
loop.run_until_complete(serve())
"""


def floor_scenario(folder: Path, threads: int, args) -> Result:
    """Two empty unary calls per round trip against :data:`FLOOR_SERVER` from ``threads``
    client threads (one channel each, as offcutd's clients): the most round trips/s gRPC
    Python itself allows on this machine, with no optimizer, no state and no fsync."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = f"unix://{folder / 'floor.sock'}"
    proc = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, address])
    try:
        with grpc.insecure_channel(address) as ch:
            grpc.channel_ready_future(ch).result(timeout=30)

        def make_worker(i: int):
            channel = grpc.insecure_channel(address)
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest()

            def round_trip() -> bool:
                stub.Check(request, timeout=60)
                stub.Check(request, timeout=60)
                return True

            return round_trip, channel.close

        result = Result("grpc floor", "unix", threads)
        cpu0 = cpu_seconds(proc.pid)
        drive(result, threads, args.seconds, args.trials, make_worker)
        cpu1 = cpu_seconds(proc.pid)
        result.server_cpu_s = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        return result
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------- the CPU budget
def registry_cpu_ms(folder: Path, round_trips: int, durability: str) -> float:
    """CPU [ms] per round trip of the Zeus registry alone, in this process: the same job and
    calls as :func:`offcut_scenario` on a ``ZeusRegistry`` over its own state file with
    ``durability``, one caller, no gRPC (each call leads its own commit: two durable commits
    per round trip, where concurrent callers share some)."""
    from offcut.daemon.edge.auth import LOCAL_ADMIN
    from offcut.zeus_views import BatchSizeJobSpec
    from offcut.daemon.zeus.registry import ZeusRegistry
    from offcut.daemon.zeus.storage import ZeusStorage

    registry = ZeusRegistry(ZeusStorage(folder / "registry.sqlite", durability=durability))
    job_id, rng = "bench-in-process", np.random.default_rng(0)
    registry.register(BatchSizeJobSpec.create(job_id=job_id, **JOB_SPEC), None, LOCAL_ADMIN,
                      "")

    def round_trip() -> None:
        pred = registry.predict(job_id, uuid.uuid4().hex, LOCAL_ADMIN)
        v = registry.report(job_id, pred.trial_number, 1, 10.0, epoch_energy(rng), TARGET,
                            LOCAL_ADMIN, pred.batch_size)
        if not v.stop:
            registry.end_trial(job_id, pred.trial_number, LOCAL_ADMIN)

    try:
        for _ in range(min(200, round_trips)):  # (pruning's first trials)
            round_trip()
        cpu0 = time.process_time()
        for _ in range(round_trips):
            round_trip()
        return 1e3 * (time.process_time() - cpu0) / round_trips
    finally:
        registry.storage.close()


def print_budget(rows: list[dict], registry_ms: float, args) -> None:
    """What this machine's cores allow per round trip at :data:`GOAL_RT_PER_S`, against the
    parts of a round trip measured here: the gRPC floor's server and client threads (the
    ``--threads`` run) and the registry alone (:func:`registry_cpu_ms`)."""
    floor = next((r for r in rows if r["server"] == "grpc floor"
                  and r["threads"] == args.threads), None)
    cores = os.cpu_count() or 1
    allowed = 1e3 * cores / GOAL_RT_PER_S
    print(f"CPU per round trip: {GOAL_RT_PER_S:g} rt/s on {cores} cores allows {allowed:.2f} ms "
          "(every core busy, servers and clients together)")
    if floor is None or floor["server_cpu_ms_per_rt"] is None:
        print(f"  the Zeus registry alone (in-process, no gRPC): {registry_ms:.2f} ms")
        return
    parts = floor["server_cpu_ms_per_rt"] + floor["client_cpu_ms_per_rt"] + registry_ms
    print(f"  parts measured here: gRPC floor server {floor['server_cpu_ms_per_rt']:.2f} + its "
          f"client threads {floor['client_cpu_ms_per_rt']:.2f} + the Zeus registry alone "
          f"(in-process, durability {args.durability}, one caller) {registry_ms:.2f} = "
          f"{parts:.2f} ms, {parts / allowed:.2f}x what the goal allows")


# ---------------------------------------------------------------------- Zeus's BSO server
class ZeusServer:
    """Zeus's BSO server under uvicorn from ``venv``, SQLite database in ``folder``."""

    def __init__(self, venv: Path, folder: Path):
        python = venv / "bin" / "python"
        hint = ZEUS_VENV_HINT.format(venv=venv)
        if not python.exists():
            raise RuntimeError(f"no Python at {python}; create the Zeus venv with:\n    {hint}")
        db = folder / "zeus-bso.sqlite"
        env = {**os.environ, "ZEUS_BSO_DATABASE_URL": f"sqlite+aiosqlite:///{db}",
               "ZEUS_BSO_LOG_LEVEL": "WARN", "ZEUS_BSO_ECHO_SQL": "false"}
        env.pop("PYTHONPATH", None)
        check = subprocess.run(
            [str(python), "-c", "import zeus, aiosqlite, greenlet, uvicorn, "
             "zeus.optimizer.batch_size.server.router; print(zeus.__version__)"],
            env=env, cwd=folder, capture_output=True, text=True, timeout=120)
        if check.returncode != 0:
            raise RuntimeError(f"{python} cannot import Zeus's BSO server "
                               f"({check.stderr.strip().splitlines()[-1] if check.stderr else '?'})"
                               f"; install it with:\n    {hint}")
        self.version = check.stdout.strip()
        self.port = free_port()
        self.log = folder / "zeus-bso.log"
        self.proc = subprocess.Popen([str(python), "-c", ZEUS_BOOT, str(self.port)], env=env,
                                     cwd=folder, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Zeus's server exited ({self.proc.returncode}):\n"
                                   f"{self.log.read_text()[-2000:]}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/openapi.json")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.close()
                raise RuntimeError(f"Zeus's server did not answer in 60 s:\n"
                                   f"{self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Http:
    """A keep-alive HTTP/1.1 JSON client for one thread."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        if resp.status not in (200, 201):
            raise RuntimeError(f"{method} {path} -> HTTP {resp.status}: {raw[:200]!r}")
        return json.loads(raw) if raw else {}

    def close(self) -> None:
        self.conn.close()


def zeus_scenario(server: ZeusServer, threads: int, args) -> Result:
    prefix = f"bench-{threads}"
    job_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    h = Http(server.port)
    h.call("POST", "/jobs", {
        "job_id": job_id, "job_id_prefix": prefix, "batch_sizes": BATCH_SIZES,
        "default_batch_size": DEFAULT_BS, "eta_knob": 0.5, "beta_knob": 2.0,
        "target_metric": TARGET, "higher_is_better_metric": True, "max_epochs": 100,
        "num_pruning_rounds": 2, "window_size": 0, "mab_prior_mean": 0.0,
        "mab_prior_precision": 0.0, "mab_num_explorations": 2, "mab_seed": 1,
        "max_power": MAX_POWER_W, "number_of_gpus": 1, "gpu_model": "bench"})
    h.close()

    def make_worker(i: int):
        client = Http(server.port)
        rng = np.random.default_rng(i)

        def round_trip() -> bool:
            trial = client.call("GET", f"/jobs/batch_size?job_id={job_id}")
            energy = epoch_energy(rng)
            v = client.call("POST", "/report", {
                "job_id": job_id, "batch_size": trial["batch_size"],
                "trial_number": trial["trial_number"], "time": 10.0, "energy": energy,
                "metric": TARGET, "current_epoch": 1})
            if args.end_trial or not v["stop_train"]:
                client.call("PATCH", "/trials", {"job_id": job_id,
                                                 "batch_size": trial["batch_size"],
                                                 "trial_number": trial["trial_number"]})
            return bool(v["converged"])

        return round_trip, client.close

    result = Result("Zeus BSO server", "HTTP/TCP", threads)
    cpu0 = cpu_seconds(server.proc.pid)
    drive(result, threads, args.seconds, args.trials, make_worker)
    cpu1 = cpu_seconds(server.proc.pid)
    result.server_cpu_s = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return result


# ---------------------------------------------------------------------- main
def fmt(v, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:{width}{spec}}"


def print_table(rows: list[dict]) -> None:
    hdr = (f"{'server':<16}{'transport':<11}{'threads':>7}{'round trips':>12}{'rt/s':>9}"
           f"{'p50 ms':>9}{'p99 ms':>9}{'first200':>10}{'last200':>9}{'cpu ms/rt':>10}"
           f"{'client':>7}{'not conv':>9}{'errors':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['server']:<16}{r['transport']:<11}{r['threads']:>7}{r['round_trips']:>12}"
              f"{fmt(r['rt_per_s'], '.1f', 9)}{fmt(r['p50_ms'], '.2f', 9)}"
              f"{fmt(r['p99_ms'], '.2f', 9)}{fmt(r['first200_p50_ms'], '.2f', 10)}"
              f"{fmt(r['last200_p50_ms'], '.2f', 9)}{fmt(r['server_cpu_ms_per_rt'], '.2f', 10)}"
              f"{fmt(r['client_cpu_ms_per_rt'], '.2f', 7)}{r['not_converged']:>9}{r['errors']:>7}")
        if r["first_error"]:
            print(f"{'':16}first error: {r['first_error']}")
        if r.get("cut_by_time"):
            print(f"{'':16}stopped by the time cap before the trial count: not comparable")


def compare(rows: list[dict], server: str, label: str, detail) -> None:
    """Print offcutd's round trips/s over ``server``'s (named ``label``) at each thread count
    both ran, with ``detail(offcutd_row, other_row)``."""
    others = {r["threads"]: r for r in rows if r["server"] == server}
    for r in rows:
        o = others.get(r["threads"])
        if r["server"] == "offcutd" and o and o["rt_per_s"]:
            print(f"offcutd {r['transport']} / {label}, {r['threads']} thread(s): "
                  f"{r['rt_per_s'] / o['rt_per_s']:.2f}x round trips/s, {detail(r, o)}")


#: the goals (docs/zeus.md, "Storage"; offcutd, durability full): round trips/s from the
#: K-thread run, and the p50 of the last 200 round trips over the first 200's (a flat cost per
#: call) once a job has 4,000 trials
GOAL_RT_PER_S, GOAL_RATIO, GOAL_TRIALS = 700.0, 1.2, 4000


def goals(rows: list[dict], args) -> None:
    """Print PASS/FAIL of each offcutd row against :data:`GOAL_RT_PER_S` (the ``--threads``
    run) and :data:`GOAL_RATIO` (runs of at least :data:`GOAL_TRIALS` round trips)."""
    for r in rows:
        if r["server"] != "offcutd":
            continue
        name = f"offcutd {r['transport']} x{r['threads']}"
        if r["threads"] == args.threads and args.threads > 1:
            ok = r["rt_per_s"] >= GOAL_RT_PER_S
            print(f"goal {name}: {r['rt_per_s']:.1f} rt/s >= {GOAL_RT_PER_S:g}: "
                  f"{'PASS' if ok else 'FAIL'}")
        if r["round_trips"] >= GOAL_TRIALS and r["last_over_first"] is not None:
            ok = r["last_over_first"] <= GOAL_RATIO
            print(f"goal {name}: p50 last 200 / first 200 = {r['last_over_first']:.2f} <= "
                  f"{GOAL_RATIO:g} after {r['round_trips']} trials: {'PASS' if ok else 'FAIL'}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("Usage::")[0].rstrip(),
        epilog="usage examples:" + __doc__.split("Usage::")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=1000,
                    help="round trips per scenario (default 1000; 0 = run for --seconds)")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="time cap of each scenario [s] (default 60)")
    ap.add_argument("--threads", type=int, default=4,
                    help="K: concurrent client threads of the second run (default 4)")
    ap.add_argument("--durability", default="full", choices=["full", "normal"],
                    help="offcutd's durability (default full: fsync every commit)")
    ap.add_argument("--tcp", action=argparse.BooleanOptionalAction, default=True,
                    help="also run offcutd on TCP loopback, the same transport as Zeus's HTTP "
                         "(default on)")
    ap.add_argument("--end-trial", action="store_true",
                    help="also close every trial (our EndTrial, Zeus's PATCH /trials), as "
                         "Zeus's client does at exit")
    ap.add_argument("--zeus-venv", type=Path, default=Path("/tmp/zeus-bso-venv"),
                    help="venv with zeus[bso-server], aiosqlite, greenlet (default "
                         "/tmp/zeus-bso-venv); see the description for how to create it")
    ap.add_argument("--no-zeus", action="store_true", help="only measure offcutd")
    ap.add_argument("--no-offcut", action="store_true", help="only measure Zeus's server")
    ap.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure the gRPC floor: two empty calls per round trip to an "
                         "empty grpc.aio server built as offcutd's (default on)")
    ap.add_argument("--budget", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure the Zeus registry alone (in-process, no gRPC) and print "
                         "the CPU per round trip this machine's cores allow at the goal against "
                         "the parts measured (default on; needs --floor for the parts)")
    ap.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    add_option(ap)
    args = ap.parse_args()
    log = ResultsLog.from_args("zeus_bso_throughput", args)
    sys.stdout.reconfigure(line_buffering=True)

    folder = Path(tempfile.mkdtemp(prefix="offcut-bso-bench-"))
    thread_counts = sorted({1, args.threads})
    print(f"{f'{args.trials} round trips per scenario, capped at ' if args.trials else ''}"
          f"{args.seconds:g} s; "
          f"threads {thread_counts}; offcutd durability {args.durability}; "
          f"{os.cpu_count()} CPUs shared by servers and clients; state under {folder}")
    rows: list[dict] = []
    transports = [] if args.no_offcut else [("unix", f"unix://{folder / 'unix' / 'offcutd.sock'}")]
    if args.tcp and not args.no_offcut:
        transports.append(("tcp", f"127.0.0.1:{free_port()}"))
    for transport, address in transports:
        sub = folder / transport
        sub.mkdir()
        daemon = Offcutd(address, sub, args.durability)
        try:
            for k in thread_counts:
                rows.append(offcut_scenario(daemon, transport, k, args).row())
                print(f"  offcutd {transport} x{k}: {rows[-1]['rt_per_s']:.1f} rt/s", flush=True)
        finally:
            daemon.close()

    if args.floor:
        for k in thread_counts:
            rows.append(floor_scenario(folder, k, args).row())
            print(f"  gRPC floor x{k}: {rows[-1]['rt_per_s']:.1f} rt/s", flush=True)

    registry_ms = None
    if args.budget:
        registry_ms = registry_cpu_ms(folder, min(args.trials or 1000, 2000), args.durability)
        print(f"  Zeus registry alone: {registry_ms:.2f} ms CPU per round trip", flush=True)

    zeus_note = None
    if not args.no_zeus:
        sub = folder / "zeus"
        sub.mkdir()
        try:
            server = ZeusServer(args.zeus_venv, sub)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            zeus_note = f"Zeus's BSO server not measured: {exc}"
        else:
            zeus_note = f"Zeus {server.version} BSO server (uvicorn, SQLite {sub / 'zeus-bso.sqlite'})"
            try:
                for k in thread_counts:
                    rows.append(zeus_scenario(server, k, args).row())
                    print(f"  Zeus x{k}: {rows[-1]['rt_per_s']:.1f} rt/s", flush=True)
            finally:
                server.close()

    with log.tee():  # the figures: printed, and kept for the results file
        print()
        print("round trip = predict + report one converging epoch"
              f"{' + end trial' if args.end_trial else ''}; latency per round trip; first200/last200 "
              "= p50 of the first/last 200 round trips; cpu ms/rt = server process CPU per round trip; "
              "client = the client threads' CPU per round trip (this process)")
        print_table(rows)
        if zeus_note:
            print(zeus_note)
        compare(rows, "Zeus BSO server", "Zeus", lambda r, o: (
            f"p50 latency {r['p50_ms']:.2f} vs {o['p50_ms']:.2f} ms"))
        compare(rows, "grpc floor", "gRPC floor", lambda r, o: (
            f"floor {o['rt_per_s']:.0f} rt/s, {fmt(o['server_cpu_ms_per_rt'], '.2f', 0)} ms server "
            "CPU per round trip"))
        goals(rows, args)
        if registry_ms is not None:
            print_budget(rows, registry_ms, args)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "zeus": zeus_note, "rows": rows,
                                         "registry_cpu_ms_per_rt": registry_ms},
                                        indent=2) + "\n")
        print(f"JSON: {args.json}")
    log.finish()


if __name__ == "__main__":
    main()
