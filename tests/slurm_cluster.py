"""A real Slurm cluster for the Slurm tests: munged + slurmctld + 4 slurmd (n1..n4) on this
machine, started once per test session by ``tests/slurm/start-slurm.sh`` (adapted from
``../shared/recipes/slurm``) and always stopped at the end.

Fixtures:

* ``slurm_cluster`` (session): a :class:`SlurmCluster`; Offcut's hooks are wired as
  PrologSlurmctld / EpilogSlurmctld and point at the unix socket ``cluster.address``. The
  tests SKIP, with the reason, when Slurm is not installed or the tests do not run as root.
* ``slurm`` (function): the same cluster, brought back to "no job, every node idle and
  resumed" before and after the test.
* ``cluster_daemon`` (function): an ``OffcutServer`` listening on ``cluster.address`` (so the
  hooks reach it) and a ``Client``; stopped at the end, which removes the socket.

Everything lives in a private folder under /tmp (reachable by the ``munge`` user, unlike
pytest's 0700 tmp folders) with a private munged socket and free ports, so nothing clashes
with a site's Slurm or another test session.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import pytest

from offcut.slurm_plugin.install import HookConfig, prolog_epilog_timeout_s, write_hooks

from daemon_helpers import wait_until

SCRIPT = Path(__file__).resolve().parent / "slurm" / "start-slurm.sh"
NODES = 4
HOOK_TIMEOUT_S = 10.0  # generous: a loaded 2-core CI machine imports grpc slowly
ACTIVE_JOB_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                     "RESIZING", "SIGNALING", "STAGE_OUT"}


def idle_set(client) -> set[str]:
    """The daemon's idle pool (node names), as ``client`` (an ``offcut.client.Client``) sees it."""
    return set(client.status(include_idle_nodes=True).idle_node_names)


def fake_command(path: Path, body: str) -> str:
    """Write an executable ``sh`` script at ``path`` running ``body`` (a fake ``sinfo`` /
    ``squeue``); returns its path."""
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def skip_reason() -> str | None:
    """Why the Slurm tests cannot run here (None: they can)."""
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sinfo", "squeue", "sbatch")
               if shutil.which(b) is None and shutil.which(b, path="/usr/sbin:/usr/bin") is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing); install with: apt-get "
                f"install munge slurmctld slurmd slurm-client (.ci/run does)")
    if os.geteuid() != 0:
        return "the Slurm tests start slurmctld/slurmd/munged and must run as root"
    return None


def _free_port_block(n: int, tries: int = 200) -> int:
    """A base port P such that P..P+n are all free on this machine."""
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(20000, 40000)
        socks = []
        try:
            for p in range(base, base + n + 1):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("0.0.0.0", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports for the test cluster")


class SlurmCluster:
    """A running test cluster and helpers to drive it. ``gpu_nodes`` get ``gpus_per_node``
    fake GPUs each (start-slurm.sh's SLURM_GPU_NODES / SLURM_GPUS_PER_NODE); ``extra_conf``:
    further slurm.conf lines (e.g. a node ``Epilog=``)."""

    def __init__(self, root: Path, nodes: int = NODES, accounting: bool = False,
                 min_job_age_s: int = 300, gpu_nodes: Iterable[str] = (),
                 features: Mapping[str, str] | None = None, gpus_per_node: int = 1,
                 extra_conf: Iterable[str] = ()):
        self.root = root
        self.accounting = accounting
        self.dir = root / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.hook_dir = root / "hooks"
        self.hook_log = root / "hooks" / "offcut-hooks.log"
        self.socket = root / "offcut" / "offcutd.sock"
        self.address = f"unix://{self.socket}"
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        base = _free_port_block(nodes + (2 if accounting else 0))  # (+ slurmdbd, MariaDB)
        self.env = dict(os.environ)
        self.env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        self.env.update({
            "SLURM_CONF": str(self.conf), "SLURM_TEST_DIR": str(self.dir),
            "SLURM_TEST_NODES": str(nodes), "SLURM_TEST_PORT0": str(base),
            "SLURM_CTLD_PORT": str(base), "SLURM_HOOK_DIR": str(self.hook_dir),
            "SLURM_PROLOG_EPILOG_TIMEOUT": str(prolog_epilog_timeout_s(HOOK_TIMEOUT_S)), "SLURM_MIN_JOB_AGE": str(min_job_age_s),
            "SLURM_ACCOUNTING": "1" if accounting else "0",
            # (the scheduling settings are docs/deployment.md's, in start-slurm.sh: no others)
            "SLURM_EXTRA_CONF": "\n".join(extra_conf),
            # GPU nodes (gpu GRES with fake device files) and node features
            "SLURM_GPU_NODES": ",".join(gpu_nodes), "SLURM_GPUS_PER_NODE": str(gpus_per_node),
            "SLURM_NODE_FEATURES": ";".join(f"{n}={f}" for n, f in (features or {}).items())})
        self.started = False

    # ------------------------------------------------------------------ life cycle
    def install_hooks(self, **overrides) -> dict[str, Path]:
        """(Re)write Offcut's hook wrappers; slurmctld runs whatever the files hold then."""
        kw = dict(address=self.address, timeout_s=HOOK_TIMEOUT_S, log_file=str(self.hook_log),
                  slurm_conf=str(self.conf), log_level="debug")
        kw.update(overrides)
        return write_hooks(self.hook_dir, HookConfig(**kw))

    def start(self) -> float:
        """Start the daemons; returns the seconds it took."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.install_hooks()
        t0 = time.monotonic()
        self.started = True  # from here on, stop() must run whatever happens
        proc = subprocess.run(["bash", str(SCRIPT), "start"], env=self.env, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"start-slurm.sh start failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
                               f"\n--- slurmctld.log:\n{self.tail('slurmctld.log')}")
        return time.monotonic() - t0

    def stop(self) -> None:
        if not self.started:
            return
        proc = subprocess.run(["bash", str(SCRIPT), "stop"], env=self.env, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0:
            print(f"start-slurm.sh stop: {proc.returncode}\n{proc.stderr[-2000:]}")
        self.started = False

    def tail(self, name: str, chars: int = 3000) -> str:
        try:
            return (self.dir / name).read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"({exc})"

    # ------------------------------------------------------------------ commands
    def run(self, *argv: str, check: bool = True, timeout: float = 30,
            input_text: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, input=input_text)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()[-1000:]}")
        return proc

    def sbatch(self, *options: str, wrap: str = "sleep 1") -> str:
        """Submit a batch job (``sbatch --parsable``); returns its id. Output goes to
        ``dir/out-<id>``."""
        out = self.run("sbatch", "--parsable", "-o", str(self.dir / "out-%j"), *options,
                       "--wrap", wrap).stdout.strip()
        return out.split(";")[0]

    def output(self, job_id: str) -> str:
        try:
            return (self.dir / f"out-{job_id}").read_text()
        except OSError:
            return ""

    def squeue_json(self) -> dict:
        return json.loads(self.run("squeue", "--json").stdout)

    def sinfo_json(self) -> dict:
        return json.loads(self.run("sinfo", "--json").stdout)

    def jobs(self) -> dict[str, dict]:
        """Every job squeue knows, by id, with ``state`` (a string) and ``node_list``."""
        out = {}
        for j in self.squeue_json()["jobs"]:
            st = j.get("job_state")
            st = st[0] if isinstance(st, list) and st else st
            j = dict(j, state=str(st), node_list=j.get("nodes") or "")
            out[str(j["job_id"])] = j
        return out

    def job_state(self, job_id: str) -> str:
        return self.jobs().get(str(job_id), {}).get("state", "UNKNOWN")

    def node_states(self) -> dict[str, str]:
        """``sinfo``'s compact state per node (``idle``, ``alloc``, ``drain`` ...)."""
        out = self.run("sinfo", "-h", "-N", "-p", "batch", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def scontrol(self, *args: str) -> None:
        self.run("scontrol", *args)

    @contextlib.contextmanager
    def launcher(self, address: str, root: Path, rescale_grace_s: float = 30.0
                 ) -> Iterator[Path]:
        """``offcut-slurm launch`` in a thread, for the daemon at ``address``: jobs run in
        ``root``, their output goes to ``root/out`` (yielded), the tasks' checkpoints to
        ``root/ckpt``; passes every 0.5 s at most. Stopped at the end of the block. Every task
        runs as this (root) process (``run_as_owner = false``): the tasks' owners here have
        no local account (tasks run as real owners: tests/test_slurm_run_as_owner.py)."""
        from offcut.client import Client
        from offcut.daemon.config import SlurmConfig
        from offcut.slurm_plugin.launcher import Launcher
        from offcut.slurm_plugin.owners import OwnerAccounts, RunAsPolicy
        from offcut.slurm_plugin.slurm_cli import SlurmCLI

        out = root / "out"
        out.mkdir(exist_ok=True)
        cfg = SlurmConfig(workdir=str(root), output=str(out / "%x-%j.out"),
                          rescale_grace_s=rescale_grace_s, checkpoint_root=str(root / "ckpt"),
                          launcher_key=str(root / "launcher.key"))
        stop = threading.Event()
        with Client(address, timeout_s=10) as client:
            launcher = Launcher(client, cfg, SlurmCLI(slurm_conf=str(self.conf)),
                                accounts=OwnerAccounts(RunAsPolicy(run_as_owner=False)))
            th = threading.Thread(target=launcher.run, args=(0.5, stop), daemon=True)
            th.start()
            try:
                yield out
            finally:
                stop.set()
                th.join(10)

    @staticmethod
    def task_checkpoints(root: Path, task_id: str) -> Path:
        """The checkpoint folder of ``task_id`` under :meth:`launcher` ``(…, root)``:
        ``root/ckpt/TASKID-SUFFIX`` (the suffix from the launcher's key, ``root/launcher.key``)."""
        from offcut.daemon.config import SlurmConfig
        from offcut.slurm_plugin.job_submission import checkpoint_dir
        from offcut.slurm_plugin.launcher_key import LauncherKey

        return checkpoint_dir(SlurmConfig(checkpoint_root=str(root / "ckpt")), task_id, None,
                              LauncherKey.load(root / "launcher.key"))

    # ------------------------------------------------------------------ waiting
    def wait_for(self, predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1,
                 what: str = "a condition") -> Any:
        """Poll ``predicate`` until it returns something truthy; returns it. AssertionError on
        timeout (with the cluster's state)."""
        try:
            return wait_until(predicate, what, timeout, every_s=interval)
        except AssertionError as exc:
            jobs = {k: (v["state"], v["node_list"]) for k, v in self.jobs().items()}
            raise AssertionError(f"{exc}; nodes {self.node_states()}, jobs {jobs}") from None

    def wait_state(self, job_id: str, states: Iterable[str], timeout: float = 30.0) -> str:
        states = set(states)
        return self.wait_for(lambda: (s := self.job_state(job_id)) in states and s,
                             timeout=timeout, what=f"job {job_id} in {sorted(states)}")

    def hook_lines(self, kind: str | None = None, job_id: str | None = None) -> list[str]:
        try:
            lines = self.hook_log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        if kind:
            lines = [ln for ln in lines if f"offcut-{kind} " in ln]
        if job_id is not None:
            lines = [ln for ln in lines if f" job={job_id} " in ln]
        return lines

    def wait_hook(self, kind: str, job_id: str, timeout: float = 20.0) -> list[str]:
        """The log lines of ``kind``'s run for ``job_id``, once it logged ``done``."""
        def done():
            lines = self.hook_lines(kind, job_id)
            return lines if any(": done (" in ln for ln in lines) else None
        return self.wait_for(done, timeout=timeout, what=f"the {kind} of job {job_id} to finish")

    def reset(self, timeout: float = 60.0) -> None:
        """Cancel every job, wait until none is active and the epilogs of those that ran have
        finished, resume every node, and wait until all are idle."""
        self.run("scancel", "--quiet", "--full", "--user=root", check=False)
        self.wait_for(lambda: not any(j["state"] in ACTIVE_JOB_STATES for j in self.jobs().values()),
                      timeout=timeout, what="all jobs to end")
        known = self.jobs()
        ran = {ln.split(" job=")[1].split()[0] for ln in self.hook_lines("prolog")
               if ": done (" in ln}
        for jid in ran & set(known):  # (a test may run a hook by hand with a made-up job id)
            self.wait_hook("epilog", jid, timeout=timeout)
        states = self.node_states()
        bad = [n for n, s in states.items() if s != "idle"]
        if bad:
            self.run("scontrol", "update", f"nodename={','.join(bad)}", "state=resume", check=False)
        self.wait_for(lambda: all(s == "idle" for s in self.node_states().values()),
                      timeout=timeout, interval=0.2, what="all nodes idle")


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="offcut-slurm-", dir="/tmp"))
    root.chmod(0o755)  # munged runs as user munge and must reach its socket folder
    cluster = SlurmCluster(root)
    try:
        took = cluster.start()
        print(f"\n[slurm] test cluster up in {took:.2f} s ({cluster.conf})")
        yield cluster
    finally:
        t0 = time.monotonic()
        cluster.stop()
        print(f"\n[slurm] test cluster stopped in {time.monotonic() - t0:.2f} s")
        shutil.rmtree(root, ignore_errors=True)


def accounting_skip_reason() -> str | None:
    """Why a cluster with accounting (slurmdbd and a private MariaDB) cannot run here."""
    reason = skip_reason()
    if reason:
        return reason
    missing = [b for b in ("slurmdbd", "mariadbd", "mariadb-install-db", "sacct", "sacctmgr")
               if shutil.which(b) is None and shutil.which(b, path="/usr/sbin:/usr/bin") is None]
    if missing:
        return (f"Slurm accounting is not installed ({', '.join(missing)} missing); install "
                "with: apt-get install slurmdbd mariadb-server (.ci/run does)")
    return None


#: the GPU node of the ``slurm_site`` cluster (one gpu GRES, feature a100)
SITE_GPU_NODE = "n3"


@pytest.fixture(scope="session")
def slurm_site():
    """A second test cluster as a site has it: 3 nodes, n1 and n2 plain, n3 with one GPU
    (gpu GRES on a fake device file, ``AutoDetect=off``) and the feature ``a100``; Slurm's
    accounting (slurmdbd on a private MariaDB) with a slurmctld that forgets ended jobs after
    2 s (``MinJobAge=2``, Slurm's least), so that ``sacct`` is the only record of them; the
    hooks point at its ``address``."""
    reason = accounting_skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="offcut-slurm-site-", dir="/tmp"))
    root.chmod(0o755)
    cluster = SlurmCluster(root, nodes=3, accounting=True, min_job_age_s=2,
                           gpu_nodes=[SITE_GPU_NODE], features={SITE_GPU_NODE: "a100"})
    try:
        took = cluster.start()
        print(f"\n[slurm] site test cluster up in {took:.2f} s ({cluster.conf})")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster):
    slurm_cluster.install_hooks()
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()
    slurm_cluster.install_hooks()


@pytest.fixture
def cluster_daemon(slurm_cluster, tmp_path):
    """``(server, client)`` of a daemon on ``slurm_cluster.address``."""
    from offcut.client import Client
    from offcut.daemon.config import DaemonConfig
    from offcut.daemon.edge.server import OffcutServer

    cfg = DaemonConfig(listen=slurm_cluster.address, state=str(tmp_path / "state.sqlite"),
                       solver="dp")
    srv = OffcutServer(cfg)
    srv.start()
    client = Client(slurm_cluster.address, timeout_s=10)
    try:
        client.wait_ready(10)
        yield srv, client
    finally:
        client.close()
        srv.stop(0.2)


@contextlib.contextmanager
def made_local_user(cluster: SlurmCluster, groups: Iterable[str] = ()) -> Iterator[Any]:
    """A real local user, made with ``useradd`` (a normal account: uid from login.defs'
    UID_MIN..UID_MAX, >= 1000; its own group, and ``groups`` besides; bash), its home in the
    cluster's folder (mode 0755 up to there, so the jobs reach it); its ``pwd`` entry. At the
    end its jobs are cancelled, and once they are gone the user, its group and its home are
    removed."""
    name = f"oc{secrets.token_hex(5)}"
    homes = cluster.root / "homes"
    homes.mkdir(exist_ok=True)
    homes.chmod(0o755)
    extra = ["--groups", ",".join(groups)] if groups else []
    proc = subprocess.run(["useradd", "--create-home", "--home-dir", str(homes / name),
                           "--user-group", *extra, "--shell", "/bin/bash", "--comment",
                           "Offcut test user", name], capture_output=True, text=True)
    assert proc.returncode == 0, f"useradd {name}: {proc.stderr.strip()}"
    try:
        yield pwd.getpwnam(name)
    finally:
        cluster.run("scancel", "--quiet", f"--user={name}", check=False)
        cluster.wait_for(
            lambda: not any(j.get("user_name") == name and j["state"] in ACTIVE_JOB_STATES
                            for j in cluster.jobs().values()),
            timeout=60, what=f"the jobs of {name} to end")
        proc = subprocess.run(["userdel", "--remove", name], capture_output=True, text=True)
        if proc.returncode not in (0, 12):  # 12: the home could not be removed (is gone)
            subprocess.run(["userdel", "--force", "--remove", name], capture_output=True)
