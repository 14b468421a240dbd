"""The power helper on real Slurm (docs/security.md, "GPU power limits"; docs/deployment.md,
"3d. GPU power limits: the power helper"): a job may set power limits only on the GPUs Slurm gave
it on this node, and the node ``Epilog`` restores every GPU's default limit when a job ends,
whatever ended it.

Real parts: a private Slurm 22.05 cluster (tests/slurm_cluster.py) of two nodes with two fake
GPUs each (gpu GRES on fake device files; n1 is the node the helper serves), the node
``Epilog=`` written by ``write_power_epilog`` (``offcut-slurm power-restore``, run by slurmd as
root at every job end), real local users made with ``useradd`` whose batch jobs run a probe
using Zeus's own ``ZeusdClient`` and plain HTTP, and the helper's HTTP server on a real unix
socket with the recording stand-in for the GPUs (no GPU here).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, made_local_user, skip_reason
from test_power_helper import DEFAULT_MW, GPU, python_for_users

from offcut.slurm_plugin.gpu_backends import StandInBackend, write_stand_in
from offcut.slurm_plugin.install import PowerEpilogConfig, write_power_epilog
from offcut.slurm_plugin.job_gpus import JobDirectory, job_by_stepd
from offcut.slurm_plugin.power_helper import PowerHelper, PowerHelperServer, PowerRecords
from offcut.slurm_plugin.slurm_cli import SlurmCLI

pytest.importorskip("zeus.utils.zeusd", reason="zeus is not installed (pip install 'offcut[zeus]')")

NODE = "n1"  # the node whose helper the tests run (every slurmd shares this host)
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "UNKNOWN")

PROBE = '''\
"""A job's process talking to the power helper: it reads commands from BOX/cmd-N.json and
writes the answers to BOX/res-N.json (set through Zeus's ZeusdClient, or any plain request)."""
import json, os, sys, time
import httpx
from zeus.utils.zeusd import ZeusdClient, ZeusdConfig

sock, box = sys.argv[1], sys.argv[2]
os.makedirs(box, exist_ok=True)
http = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://localhost",
                    timeout=30)
zeus = ZeusdClient(ZeusdConfig.uds(sock))


def put(name, doc):
    tmp = os.path.join(box, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, os.path.join(box, name))


put("ready", {"pid": os.getpid()})
n = 0
while True:
    path = os.path.join(box, f"cmd-{n}.json")
    if not os.path.exists(path):
        time.sleep(0.05)
        continue
    with open(path) as f:
        cmd = json.load(f)
    if cmd["op"] == "exit":
        sys.exit(cmd["code"])
    if cmd["op"] == "zeus_set":
        try:
            zeus.set_power_limit(cmd["gpus"], cmd["mw"])
            res = {"ok": True}
        except Exception as exc:
            res = {"ok": False, "error": str(exc)}
    else:
        r = http.request(cmd["method"], cmd["path"])
        res = {"status": r.status_code, "body": r.json() if r.content else None}
    put(f"res-{n}.json", res)
    n += 1
'''


class GpuSite:
    """The cluster, the helper's files and, while a test runs, the helper itself."""

    def __init__(self, root: Path):
        self.root = root
        self.stand_in = root / "gpus.json"
        self.records = root / "records.json"
        self.socket = root / "run" / "power.sock"
        self.epilog_log = root / "power-epilog.log"
        self.probe = root / "probe.py"
        self.probe.write_text(PROBE)
        self.probe.chmod(0o644)
        write_stand_in(self.stand_in, [dict(GPU, name=f"{NODE} GPU {i}") for i in range(2)])
        epilog = write_power_epilog(root / "power-hooks", PowerEpilogConfig(
            socket=str(self.socket), gpus=f"fake:{self.stand_in}", state=str(self.records),
            node=NODE, log_file=str(self.epilog_log), timeout_s=5))
        self.cluster = SlurmCluster(root, nodes=2, gpu_nodes=["n1", "n2"], gpus_per_node=2,
                                    extra_conf=[f"Epilog={epilog}"])
        self.server: PowerHelperServer | None = None
        self.backend: StandInBackend | None = None

    def start_helper(self) -> StandInBackend:
        write_stand_in(self.stand_in, [dict(GPU, name=f"{NODE} GPU {i}") for i in range(2)])
        self.backend = StandInBackend(self.stand_in)
        jobs = JobDirectory(SlurmCLI(slurm_conf=str(self.cluster.conf)), ttl_s=1.0)
        helper = PowerHelper(self.backend, jobs, NODE, PowerRecords(self.records))
        self.server = PowerHelperServer(helper, str(self.socket)).start()
        return self.backend

    def stop_helper(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def epilog_lines(self, job_id: str) -> list[str]:
        try:
            lines = self.epilog_log.read_text().splitlines()
        except OSError:
            return []
        return [ln for ln in lines if f"job {job_id}:" in ln]


@pytest.fixture(scope="module")
def gpu_site():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="offcut-slurm-power-", dir="/tmp"))
    root.chmod(0o755)  # munged and the test users must reach their folders
    site = GpuSite(root)
    try:
        site.cluster.start()
        yield site
    finally:
        site.stop_helper()
        site.cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def site(gpu_site):
    gpu_site.start_helper()
    yield gpu_site
    gpu_site.stop_helper()


class Probe:
    """Drives one probe process through its command box (module's PROBE)."""

    def __init__(self, site: GpuSite, box: Path, job_id: str | None = None,
                 proc: subprocess.Popen | None = None):
        self.site, self.box, self.job_id, self.proc, self.n = site, box, job_id, proc, 0

    def _why(self) -> str:
        if self.job_id:
            return (f"job {self.job_id} is {self.site.cluster.job_state(self.job_id)}; its "
                    f"output: {_output(self.box.parent, self.job_id)[-2000:]}")
        return f"probe process: {self.proc.poll() if self.proc else None}"

    def ready(self, timeout: float = 90) -> "Probe":
        self.site.cluster.wait_for(lambda: (self.box / "ready").exists() or
                                   (self.job_id and self.site.cluster.job_state(self.job_id) in ENDED),
                                   timeout=timeout, what=f"the probe in {self.box}")
        assert (self.box / "ready").exists(), self._why()
        return self

    def ask(self, cmd: dict, timeout: float = 60) -> dict:
        tmp = self.box / f"cmd-{self.n}.tmp"
        tmp.write_text(json.dumps(cmd))
        tmp.chmod(0o644)
        os.replace(tmp, self.box / f"cmd-{self.n}.json")
        res = self.box / f"res-{self.n}.json"
        deadline = time.monotonic() + timeout
        while not res.exists():
            assert time.monotonic() < deadline, f"no answer to {cmd}: {self._why()}"
            time.sleep(0.05)
        self.n += 1
        return json.loads(res.read_text())

    def whoami(self) -> dict:
        return self.ask({"op": "http", "method": "GET", "path": "/offcut/whoami"})["body"]

    def set(self, gpus: list[int], mw: int) -> tuple[int, str]:
        r = self.ask({"op": "http", "method": "POST", "path":
                      f"/gpu/set_power_limit?gpu_ids={','.join(map(str, gpus))}"
                      f"&power_limit_mw={mw}&block=true"})
        return r["status"], (r["body"] or {}).get("error", "")

    def zeus_set(self, gpus: list[int], mw: int) -> dict:
        return self.ask({"op": "zeus_set", "gpus": gpus, "mw": mw})

    def get(self, path: str) -> tuple[int, dict]:
        r = self.ask({"op": "http", "method": "GET", "path": path})
        return r["status"], r["body"]

    def exit(self, code: int = 0) -> None:
        (self.box / f"cmd-{self.n}.json").write_text(json.dumps({"op": "exit", "code": code}))


def _output(home: Path, job_id: str) -> str:
    try:
        return (home / f"out-{job_id}").read_text(errors="replace")
    except OSError as exc:
        return f"({exc})"


def _probe_argv(site: GpuSite, box: Path) -> list[str]:
    return python_for_users(f"import runpy; runpy.run_path({str(site.probe)!r}, "
                            "run_name='__main__')") + [str(site.socket), str(box)]


def job_probe(site: GpuSite, user, name: str, node: str = NODE, gpus: int = 1) -> Probe:
    """A batch job of ``user`` on ``node`` holding ``gpus`` GPUs, running the probe."""
    home = Path(user.pw_dir)
    box = home / name
    job_id = site.cluster.run(
        "sbatch", "--parsable", f"--uid={user.pw_uid}", f"--gid={user.pw_gid}", "-w", node,
        f"--gres=gpu:{gpus}", "-o", str(home / "out-%j"), f"--chdir={home}",
        f"--export=ALL,HOME={home},USER={user.pw_name}", "--wrap",
        shlex.join(_probe_argv(site, box))).stdout.strip().split(";")[0]
    return Probe(site, box, job_id).ready()


def outside_probe(site: GpuSite, user, name: str) -> Probe:
    """The probe as ``user`` outside any job (a login-shell process on the node)."""
    home = Path(user.pw_dir)
    proc = subprocess.Popen(_probe_argv(site, home / name), user=user.pw_uid, group=user.pw_gid,
                            extra_groups=[], cwd=home, env={"PATH": "/usr/bin:/bin",
                                                            "HOME": str(home)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Probe(site, home / name, proc=proc).ready()


def wait_default(site: GpuSite, gpu: int, what: str, timeout: float = 60) -> None:
    site.cluster.wait_for(lambda: site.backend.limits()[gpu] == DEFAULT_MW, timeout=timeout,
                          what=f"GPU {gpu} back at its default limit after {what}; limits "
                               f"{site.backend.limits()}, epilog log: "
                               f"{site.epilog_log.read_text() if site.epilog_log.exists() else ''}")


def test_a_job_sets_only_its_own_gpus_and_the_epilog_restores_them(site):
    """User A's job sets its GPU through Zeus's client; it is refused (403) on a GPU it does
    not hold, on user B's job's GPU, from a process outside its job and from its job on
    another node; B's job likewise. A's job ends normally and B's is cancelled (scancel, as a
    preemption does): the epilog restores each job's GPU, and only that one."""
    cluster, backend = site.cluster, site.backend
    with made_local_user(cluster) as alice, made_local_user(cluster) as bob:
        a1 = job_probe(site, alice, "a1")
        me = a1.whoami()
        assert me["job_id"] == a1.job_id and me["uid"] == alice.pw_uid and me["node"] == NODE
        (mine,) = me["gpu_ids"]  # Slurm's GRES index, one of n1's two
        other = 1 - mine
        assert a1.zeus_set([mine], 200_000) == {"ok": True}  # Zeus's own client, unchanged
        assert backend.limits()[mine] == 200_000 and backend.limits()[other] == DEFAULT_MW
        assert f"uid {alice.pw_uid}" in backend.calls()[-1]["by"]
        assert PowerRecords(site.records).all()[mine]["job_id"] == a1.job_id
        status, error = a1.set([other], 150_000)  # a GPU no job holds
        assert status == 403 and f"job {a1.job_id} holds GPU(s) {mine} on node n1" in error
        status, body = a1.get("/gpu/get_power_limit")  # reads: its own GPUs
        assert status == 200 and body == {str(mine): {"power_limit_mw": 200_000}}
        assert a1.get(f"/gpu/get_power_limit?gpu_ids={other}")[0] == 403

        b1 = job_probe(site, bob, "b1")
        assert b1.whoami()["gpu_ids"] == [other]
        assert b1.set([other], 150_000) == (200, "")
        status, error = a1.set([other], 120_000)  # another user's job's GPU
        assert status == 403 and "not GPU" in error
        status, error = b1.set([mine], 120_000)
        assert status == 403 and f"job {b1.job_id} holds GPU(s) {other}" in error
        status, error = a1.set([mine, other], 120_000)  # all or nothing
        assert status == 403 and backend.limits()[mine] == 200_000

        outside = outside_probe(site, alice, "outside")  # alice, but not her job's process
        try:
            assert outside.whoami()["job_id"] is None
            status, error = outside.set([mine], 120_000)
            assert status == 403 and "is not in a Slurm job" in error
        finally:
            outside.exit()
            outside.proc.wait(30)

        a2 = job_probe(site, alice, "a2", node="n2")  # her job, same index, another node
        status, error = a2.set([mine], 120_000)
        assert status == 403 and f"job {a2.job_id} has no allocation on node n1" in error
        assert backend.limits() == [200_000, 150_000][::1 if mine == 0 else -1]

        # ends: A's job normally, B's by scancel; each epilog restores its own GPU only
        a1.exit(0)
        cluster.wait_state(a1.job_id, ["COMPLETED"], timeout=60)
        wait_default(site, mine, f"job {a1.job_id} completed")
        assert backend.limits()[other] == 150_000
        assert any("restored through the helper" in ln for ln in site.epilog_lines(a1.job_id))
        cluster.run("scancel", b1.job_id)
        wait_default(site, other, f"job {b1.job_id} was cancelled")
        cluster.run("scancel", a2.job_id)
        cluster.wait_for(lambda: any("skipped" in ln for ln in site.epilog_lines(a2.job_id)),
                         timeout=60, what="n2's epilog to leave n1's helper alone")
        assert PowerRecords(site.records).all() == {}
        # an ended job's process (if one were left) could set nothing any more
        assert site.server._server.helper._ended.keys() >= {a1.job_id, b1.job_id}


def _kill_job_processes(job_id: str) -> list[int]:
    """SIGKILL every process of ``job_id`` on this host (those under its slurmstepd)."""
    # all of them found first: a process whose parent was killed is no longer under the
    # slurmstepd (it is re-parented to init) and would be left running
    found = [int(e) for e in os.listdir("/proc") if e.isdigit() and job_by_stepd(int(e)) == job_id]
    killed = []
    for pid in found:
        try:
            os.kill(pid, 9)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def test_the_epilog_restores_after_a_kill_9_and_with_the_helper_down(site):
    """A job whose processes are all SIGKILLed ends (FAILED) and its epilog restores its GPU
    through the helper; a job cancelled while the helper is down has its GPU restored by the
    epilog directly (the record and the GPUs, as root)."""
    cluster, backend = site.cluster, site.backend
    with made_local_user(cluster) as alice:
        a3 = job_probe(site, alice, "a3", gpus=2)
        assert a3.whoami()["gpu_ids"] == [0, 1]
        assert a3.zeus_set([0, 1], 180_000) == {"ok": True}
        assert backend.limits() == [180_000, 180_000]
        assert _kill_job_processes(a3.job_id)  # the batch shell and the probe
        cluster.wait_state(a3.job_id, ["FAILED", "CANCELLED", "COMPLETED"], timeout=60)
        wait_default(site, 0, f"job {a3.job_id}'s processes were killed")
        wait_default(site, 1, f"job {a3.job_id}'s processes were killed")
        assert any("restored through the helper" in ln for ln in site.epilog_lines(a3.job_id))

        a4 = job_probe(site, alice, "a4")
        (gpu,) = a4.whoami()["gpu_ids"]
        assert a4.set([gpu], 130_000) == (200, "")
        site.stop_helper()  # the helper is gone (crashed, restarted, ...) when the job ends
        cluster.run("scancel", a4.job_id)
        wait_default(site, gpu, f"job {a4.job_id} was cancelled with the helper down")
        (line,) = [ln for ln in site.epilog_lines(a4.job_id) if "restored directly" in ln]
        assert "unreachable" in line
        assert PowerRecords(site.records).all() == {}
