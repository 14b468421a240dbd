"""The power helper's API contract and rules without Slurm (slurm_plugin/power_helper.py;
docs/deployment.md, "3d. GPU power limits: the power helper"; docs/security.md, "GPU power
limits").

Real parts: the helper's HTTP server on a real unix socket, Zeus's own client
(``zeus.utils.zeusd.ZeusdClient``, also through ``ZEUSD_SOCK_PATH``), the recording stand-in
backend (fake GPUs in a JSON file, every set recorded), the kernel's ``SO_PEERCRED`` of a
process running as another user (``nobody``), the epilog program as a subprocess. The rules on
real Slurm jobs are in tests/test_power_helper_slurm.py.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from offcut.slurm_plugin.gpu_backends import StandInBackend, open_backend, write_stand_in
from offcut.slurm_plugin.install import (PowerEpilogConfig, power_epilog_conf_line,
                                         write_power_epilog)
from offcut.slurm_plugin.job_gpus import (JobDirectory, JobGpus, job_by_cgroup, job_by_stepd,
                                          parse_gres_gpus, parse_index_list, parse_show_job)
from offcut.slurm_plugin.job_submission import _everyone_may
from offcut.slurm_plugin.power_helper import (PowerHelper, PowerHelperServer, PowerRecords,
                                              epilog_restore)
from offcut.slurm_plugin.slurm_cli import SlurmCLI

from daemon_helpers import wait_until

MIN_MW, MAX_MW, DEFAULT_MW = 100_000, 400_000, 300_000
GPU = {"min_power_limit_mw": MIN_MW, "max_power_limit_mw": MAX_MW,
       "default_power_limit_mw": DEFAULT_MW}


@pytest.fixture
def shared_dir():
    """A folder under /tmp that every user may traverse (pytest's are 0700), root's only to
    write: the socket's folder must be."""
    d = Path(tempfile.mkdtemp(prefix="offcut-power-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class FakeJobs:
    """A :class:`JobDirectory` stand-in for the rules without Slurm: ``pids`` maps a pid to its
    job id, ``jobs`` a job id to its description."""

    def __init__(self):
        self.pids: dict[int, str] = {}
        self.jobs: dict[str, JobGpus] = {}
        self.forgotten: list[str] = []

    def job_of(self, pid):
        return self.pids.get(pid)

    def job(self, job_id):
        return self.jobs.get(job_id)

    def forget(self, job_id):
        self.forgotten.append(job_id)


def start_helper(d: Path, jobs=None, gpus: int = 2, **kw):
    stand_in = write_stand_in(d / "gpus.json", [dict(GPU, name=f"Stand-in {i}")
                                                for i in range(gpus)])
    backend = StandInBackend(stand_in)
    helper = PowerHelper(backend, jobs if jobs is not None else JobDirectory(SlurmCLI()), "n1",
                         PowerRecords(d / "records.json"))
    server = PowerHelperServer(helper, str(d / "run" / "power.sock"), **kw).start()
    return server, helper, backend


def http(sock: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://localhost",
                        timeout=10)


# ----------------------------------------------------------------------------- (a) Zeus's client
def test_zeus_client_discovers_sets_and_reads_through_the_helper(shared_dir, monkeypatch):
    zeusd = pytest.importorskip("zeus.utils.zeusd", reason="zeus is not installed "
                                "(pip install 'offcut[zeus]')")
    from zeus.device.exception import ZeusdError

    server, helper, backend = start_helper(shared_dir)
    try:
        monkeypatch.setenv("ZEUSD_SOCK_PATH", server.socket_path)  # how Zeus finds zeusd
        client = zeusd.ZeusdClient()
        zeusd.require_capabilities(client, read_gpu=True, control_gpu=True, gpu_ids=[0, 1])
        assert client.gpu_ids == [0, 1] and [g.name for g in client.gpus] == [
            "Stand-in 0", "Stand-in 1"]
        assert client.can_control_gpu and client.can_read_gpu and not client.auth_required
        assert client.get_power_limit_constraints() == {0: (MIN_MW, MAX_MW), 1: (MIN_MW, MAX_MW)}
        assert client.get_power_limit() == {0: DEFAULT_MW, 1: DEFAULT_MW}

        client.set_power_limit([1], 250_000)
        assert client.get_power_limit([1]) == {1: 250_000}
        assert backend.limits() == [DEFAULT_MW, 250_000]  # the "GPU" itself changed
        (call,) = backend.calls()
        assert call["gpu"] == 1 and call["power_limit_mw"] == 250_000
        assert f"pid {os.getpid()}" in call["by"]

        client.set_power_limit([0, 1], 150_000, block=False)
        assert client.get_power_limit() == {0: 150_000, 1: 150_000}
        e0 = client.get_gpu_energy([0, 1])
        assert set(e0) == {0, 1} and all(v >= 0 for v in e0.values())
        # (the stand-in's counter runs with wall time)
        assert wait_until(lambda: client.get_gpu_energy([0])[0] > e0[0],
                          "GPU 0's energy counter to grow", 30)
        snap = client.get_gpu_power([1])
        assert snap.power_mw == {1: int(0.75 * 150_000)} and snap.timestamp_ms > 0
        assert abs(client.get_time() - time.time()) < 60

        with pytest.raises(ZeusdError, match="power_limit_mw: 50000 mW is outside GPU 0's range"):
            client.set_power_limit([0], 50_000)
        with pytest.raises(ZeusdError, match="gpu_ids: GPU index 2 does not exist"):
            client.set_power_limit([2], 200_000)
        with pytest.raises(ZeusdError, match="not provide"):  # zeusd's clocks: not here
            client.set_gpu_locked_clocks([0], 1000, 1500)
        assert backend.limits() == [150_000, 150_000]
        # root outside any job: allowed, and nothing recorded for an epilog to restore
        assert PowerRecords(shared_dir / "records.json").all() == {}
    finally:
        server.stop()
    assert not os.path.exists(server.socket_path)


def test_bad_input_is_400_naming_the_field(shared_dir):
    server, helper, backend = start_helper(shared_dir)
    try:
        with http(server.socket_path) as c:
            def post(query: str) -> tuple[int, str]:
                r = c.post("/gpu/set_power_limit?" + query)
                return r.status_code, r.json()["error"] if r.content else ""

            ok = "gpu_ids=0&power_limit_mw=200000&block=true"
            assert post(ok) == (200, "")
            for query, field in [
                    ("power_limit_mw=200000&block=true", "gpu_ids: missing"),
                    ("gpu_ids=&power_limit_mw=200000&block=true", "gpu_ids: must contain"),
                    ("gpu_ids=0,,1&power_limit_mw=200000&block=true", "gpu_ids: contains an empty"),
                    ("gpu_ids=x&power_limit_mw=200000&block=true", "gpu_ids: invalid GPU index"),
                    ("gpu_ids=-1&power_limit_mw=200000&block=true", "gpu_ids: invalid GPU index"),
                    ("gpu_ids=7&power_limit_mw=200000&block=true", "gpu_ids: GPU index 7 does not exist"),
                    (",".join(["gpu_ids=0"] + ["0"] * 300) + "&power_limit_mw=1&block=true", "gpu_ids: at most"),
                    ("gpu_ids=0&block=true", "power_limit_mw: missing"),
                    ("gpu_ids=0&power_limit_mw=-5&block=true", "power_limit_mw: expected milliwatts"),
                    ("gpu_ids=0&power_limit_mw=2.5e5&block=true", "power_limit_mw: expected milliwatts"),
                    (f"gpu_ids=0&power_limit_mw={2**32}&block=true", "power_limit_mw: expected milliwatts"),
                    ("gpu_ids=0&power_limit_mw=99999&block=true", "power_limit_mw: 99999 mW is outside"),
                    ("gpu_ids=0&power_limit_mw=200000", "block: missing"),
                    ("gpu_ids=0&power_limit_mw=200000&block=yes", "block: expected true or false"),
                    (ok + "&power_limit_w=200", "power_limit_w: unknown query field"),
                    (ok + "&gpu_ids=1", "gpu_ids: given twice"),
                    (ok + "".join(f"&f{i}=1" for i in range(20)), "query: more than 16 fields")]:
                status, error = post(query)
                assert (status, error[:len(field)]) == (400, field), query
            assert c.get("/gpu/get_power_limit?gpu_ids=0&x=1").json()["error"].startswith("x: unknown")
            assert c.get("/gpu/get_power_limit?gpu_ids=9").status_code == 400
            assert c.get("/nope").status_code == 404
            assert c.get("/auth/whoami").status_code == 404  # no tokens here (zeusd: 404 too)
            assert c.get("/gpu/set_power_limit?" + ok).status_code == 405
            assert c.post("/gpu/get_power_limit").status_code == 405
            assert c.post("/gpu/set_persistence_mode?gpu_ids=0&enabled=true&block=true").status_code == 501
            assert c.get("/cpu/get_power").status_code == 501
            # sizes: a request head over 16 KiB and a body over 4 KiB are 413, not read on
            r = c.get("/discover", headers={"X-Big": "a" * 20_000})
            assert r.status_code == 413 and "request head over" in r.json()["error"]
            r = c.post("/gpu/set_power_limit?" + ok, content=b"x" * 10_000)
            assert r.status_code == 413 and "body over" in r.json()["error"]
            assert c.post("/gpu/set_power_limit?" + ok, content=b"ignored").status_code == 200
        # only the accepted sets reached the "GPU"
        assert [(x["gpu"], x["power_limit_mw"]) for x in backend.calls()] == [(0, 200_000)] * 2
    finally:
        server.stop()


HOLD = ("import socket, sys\n"
        "socks = []\n"
        "for _ in range(int(sys.argv[2])):\n"
        "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); socks.append(s)\n"
        "print('ready', flush=True); sys.stdin.read()\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs clients as other users (needs root)")
def test_connections_are_bounded_per_user_and_in_all_but_never_roots(shared_dir):
    """``nobody`` holding its 2 connections (``max_per_user``) gets 503 for a third; with
    ``daemon``'s one the total (3) is reached and ``daemon`` gets 503 too; root (the epilog) is
    answered all along; when the holders go, the others are served again."""
    server, *_ = start_helper(shared_dir, max_connections=3, max_per_user=2, idle_timeout_s=60)
    nobody, daemon = pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("daemon").pw_uid
    holders = []
    try:
        for uid, n in ((nobody, 2), (daemon, 1)):
            h = subprocess.Popen([*python_for_users(HOLD), server.socket_path, str(n)], user=uid,
                                 group=pwd.getpwuid(uid).pw_gid, cwd="/", stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            holders.append(h)
            assert h.stdout.readline().strip() == "ready"

        def both_refused():  # (the server counts a connection once its thread has it)
            (s1, b1), = _as_user(nobody, server.socket_path, [("GET", "/discover")])
            (s2, b2), = _as_user(daemon, server.socket_path, [("GET", "/discover")])
            return (s1, s2) == (503, 503) and (b1, b2)

        b1, b2 = wait_until(both_refused, "503 for both users", 30)
        assert b1["error"].startswith(f"more than 2 connections of uid {nobody}")
        assert b2["error"].startswith("more than 3 connections at once")
        with http(server.socket_path) as c:
            assert c.get("/discover").status_code == 200  # root is never refused
        for h in holders:
            h.stdin.close()
            h.wait(30)
        wait_until(lambda: _as_user(nobody, server.socket_path, [("GET", "/discover")])[0][0]
                   == 200, "nobody served again once the holders went", 30)
    finally:
        for h in holders:
            h.kill()
            h.wait(30)
        server.stop()


def test_idle_connections_are_closed(shared_dir):
    server, *_ = start_helper(shared_dir, idle_timeout_s=0.5)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(server.socket_path)
        s.settimeout(30)
        assert s.recv(10) == b""  # closed by the helper, well before 30 s
    finally:
        s.close()
        server.stop()


# ----------------------------------------------------------------------------- who may set
def python_for_users(code: str) -> list[str]:
    """argv running Python ``code`` with this environment's packages, runnable by any user:
    this interpreter when every folder above it is o+x, else the system's of the same version
    with this environment's site-packages added (this one may live in root's 0700 home)."""
    def reachable(path: str) -> bool:  # the launcher's own rule for the jobs' supervisor
        return _everyone_may(path, stat.S_IXOTH)

    if reachable(sys.executable):
        return [sys.executable, "-c", code]
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(system) or not reachable(system):
        pytest.skip(f"no interpreter other users may run: {sys.executable} is not, and "
                    f"{system} is missing")
    site_dir = sysconfig.get_paths()["purelib"]
    return [system, "-c", f"import site; site.addsitedir({site_dir!r})\n" + code]


def _as_user(uid: int, sock: str, requests: list[tuple[str, str]]) -> list[tuple[int, dict]]:
    """Run ``requests`` ((method, path) pairs) from a child process running as ``uid``."""
    code = (
        "import json, sys, httpx\n"
        "c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), base_url='http://l')\n"
        "out = []\n"
        "for m, p in json.loads(sys.argv[2]):\n"
        "    r = c.request(m, p)\n"
        "    out.append((r.status_code, r.json() if r.content else None))\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([*python_for_users(code), sock, json.dumps(requests)],
                          capture_output=True, text=True, timeout=60,
                          user=uid, group=pwd.getpwuid(uid).pw_gid, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return [tuple(x) for x in json.loads(proc.stdout)]


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a client as another user (needs root)")
def test_a_process_outside_any_job_is_refused_by_its_kernel_credentials(shared_dir):
    """``nobody`` connects (the kernel's SO_PEERCRED says uid 65534, whatever it sends): it
    may discover, but neither set nor read a GPU, nor restore."""
    nobody = pwd.getpwnam("nobody").pw_uid
    server, helper, backend = start_helper(shared_dir)
    try:
        assert os.stat(server.socket_path).st_mode & 0o777 == 0o666
        got = _as_user(nobody, server.socket_path, [
            ("GET", "/discover"), ("GET", "/offcut/whoami"),
            ("POST", "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=200000&block=true"),
            ("GET", "/gpu/get_power_limit"), ("GET", "/gpu/get_power_limit?gpu_ids=1"),
            ("POST", "/offcut/restore?job_id=5")])
        assert got[0][0] == 200 and len(got[0][1]["gpus"]) == 2
        assert got[1] == (200, {"pid": got[1][1]["pid"], "uid": nobody, "job_id": None,
                                "node": "n1", "gpu_ids": [], "all_gpus": False,
                                "why_none": got[1][1]["why_none"]})
        assert "is not in a Slurm job" in got[1][1]["why_none"]
        for status, body in got[2:5]:
            assert status == 403 and "is not in a Slurm job" in body["error"]
        assert got[5][0] == 403 and "only root" in got[5][1]["error"]
        assert backend.calls() == [] and backend.limits() == [DEFAULT_MW] * 2
    finally:
        server.stop()


def test_the_rules_for_jobs_and_the_restore(shared_dir):
    """The decision table (a fake job directory; the real one is the Slurm test): a job's
    process may use only its job's GPUs on this node, while the job runs, as its owner; the
    restore (root) sets them back, drops the record and ends the job's right to set."""
    jobs = FakeJobs()
    server, helper, backend = start_helper(shared_dir, jobs=jobs, gpus=4)
    try:
        check_rules(shared_dir, jobs, server, helper, backend)
    finally:
        server.stop()


def check_rules(shared_dir, jobs, server, helper, backend):
    me = 1234
    jobs.jobs = {"7": JobGpus("7", me, "RUNNING", {"n1": frozenset({0, 1}), "n2": frozenset({2})}),
                 "8": JobGpus("8", 999, "RUNNING", {"n1": frozenset({2})}),
                 "9": JobGpus("9", me, "COMPLETING", {"n1": frozenset({3})}),
                 "10": JobGpus("10", me, "RUNNING", {"n2": frozenset({3})})}
    from offcut.slurm_plugin.power_helper import Caller, HelperError

    pids = iter(range(40000, 41000))

    def caller(job):
        pid = next(pids)
        if job:
            jobs.pids[pid] = job
        return Caller(pid, me, me)

    def set_(c, ids, mw=200_000):
        helper.set_power_limit(c, {"gpu_ids": ids, "power_limit_mw": str(mw), "block": "true"})

    in7 = caller("7")
    set_(in7, "0,1")
    assert backend.limits() == [200_000, 200_000, DEFAULT_MW, DEFAULT_MW]
    assert helper.whoami(in7, {})["gpu_ids"] == [0, 1]
    assert helper.get_power_limit(in7, {}) == {"0": {"power_limit_mw": 200_000},
                                               "1": {"power_limit_mw": 200_000}}
    for c, ids, why in [(in7, "2", "job 7 holds GPU(s) 0, 1 on node n1, not GPU 2"),
                        (in7, "1,3", "not GPU 3"),
                        (caller(None), "0", "is not in a Slurm job"),
                        (caller("8"), "2", "job 8 belongs to uid 999"),
                        (caller("9"), "3", "job 9 is COMPLETING, not RUNNING"),
                        (caller("10"), "3", "job 10 has no allocation on node n1"),
                        (caller("11"), "0", "Slurm does not know job 11")]:
        with pytest.raises(HelperError, match=re.escape(why)) as err:
            set_(c, ids)
        assert err.value.status == 403
    assert PowerRecords(shared_dir / "records.json").all().keys() == {0, 1}

    # the epilog (root) through the socket: job 7's GPUs back to default, then no more sets
    line = epilog_restore("7", "0,1", socket_path=server.socket_path, backend_spec=None,
                          state=str(shared_dir / "records.json"))
    assert line.startswith("job 7: restored through the helper"), line
    assert backend.limits() == [DEFAULT_MW] * 4 and "7" in jobs.forgotten
    assert PowerRecords(shared_dir / "records.json").all() == {}
    with pytest.raises(HelperError, match="job 7 has ended") as err:
        set_(in7, "0")
    assert err.value.status == 403
    # a restore with nothing changed is fine, and names what it left alone
    body = helper.restore(Caller(1, 0, 0), {"job_id": "12", "gpu_ids": "2,3,70"})
    assert body == {"job_id": "12", "restored": {}, "unchanged": [2, 3],
                    "errors": {"70": "GPU index 70 does not exist on this node"}}


def test_the_epilog_restores_directly_when_the_helper_is_down(shared_dir):
    """``offcut-slurm power-restore`` as Slurm runs it (a subprocess, job id and GPUs in its
    environment): restores through the record and the backend when no helper answers, always
    exits 0, and does nothing for another node's epilog or a garbage job id."""
    jobs = FakeJobs()
    server, helper, backend = start_helper(shared_dir, jobs=jobs, gpus=3)
    from offcut.slurm_plugin.power_helper import Caller

    jobs.jobs["21"] = JobGpus("21", 0, "RUNNING", {"n1": frozenset({0, 1, 2})})
    jobs.pids[777] = "21"
    helper.set_power_limit(Caller(777, 0, 0), {"gpu_ids": "2", "power_limit_mw": "120000",
                                               "block": "true"})
    backend.set_limit(0, 110_000, by="someone as root")  # not recorded, but the job's GPU
    server.stop()  # the helper is down when the job ends
    log = shared_dir / "epilog.log"
    spec = f"fake:{shared_dir / 'gpus.json'}"

    def epilog(env: dict, *args: str) -> subprocess.CompletedProcess:
        e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        return subprocess.run(
            [sys.executable, "-I", "-m", "offcut.slurm_plugin.cli", "power-restore",
             "--socket", server.socket_path, "--gpus", spec, "--state",
             str(shared_dir / "records.json"), "--log-file", str(log), *args],
            env={**e, **env}, capture_output=True, text=True, timeout=60)

    for env, args in [({"SLURM_JOB_ID": "abc"}, ()), ({}, ()),
                      ({"SLURM_JOB_ID": "21", "SLURMD_NODENAME": "n2"}, ("--node", "n1")),
                      ({"SLURM_JOB_ID": "21", "SLURM_JOB_GPUS": "0-zz"},
                       ("--gpus", "fake:/nonexistent"))]:
        assert epilog(env, *args).returncode == 0
    assert backend.limits() == [110_000, DEFAULT_MW, 120_000]  # none of those restored
    text = log.read_text()
    assert "no valid job id" in text and "helper of node n1: skipped" in text
    assert "SLURM_JOB_GPUS ignored" in text and "/nonexistent" in text

    proc = epilog({"SLURM_JOB_ID": "21", "SLURM_JOB_GPUS": "0,1", "SLURMD_NODENAME": "n1"},
                  "--node", "n1")
    assert proc.returncode == 0, proc.stderr
    assert backend.limits() == [DEFAULT_MW] * 3  # 0 from SLURM_JOB_GPUS, 2 from the record
    last = log.read_text().splitlines()[-1]
    assert "unreachable" in last and "restored directly" in last
    assert PowerRecords(shared_dir / "records.json").all() == {}
    assert epilog({"SLURM_JOB_ID": "21", "SLURM_JOB_GPUS": "0,1"}).returncode == 0  # again: no-op
    assert len(backend.calls()) == 4  # 2 sets + 2 restores, the second epilog changed nothing


def test_the_epilog_wrapper(shared_dir):
    path = write_power_epilog(shared_dir / "hooks", PowerEpilogConfig(
        socket=str(shared_dir / "none.sock"), gpus=f"fake:{shared_dir / 'missing.json'}",
        node="n1", python="/nonexistent/python"))
    assert os.access(path, os.X_OK) and power_epilog_conf_line(path) == f"Epilog={path}"
    text = path.read_text()
    assert "power-restore" in text and "--node n1" in text and text.endswith("exit 0\n")
    # even an interpreter that cannot start does not fail the job's end
    assert subprocess.run(["/bin/sh", str(path)], env={}, timeout=30).returncode == 0
    assert "nonexistent" in (shared_dir / "hooks" / "offcut-power-epilog.log").read_text()


# ----------------------------------------------------------------------------- parsing
SHOW_JOB = ("JobId=3 JobName=wrap UserId=alice(1500) GroupId=alice(1500) MCS_label=N/A "
            "JobState=RUNNING Reason=None NumNodes=3 NodeList=n[1-3] JOB_GRES=gpu:5 "
            "  Nodes=n[1-2] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1) "
            "  Nodes=n3 CPU_IDs=0-1 Mem=0 GRES=gpu:a100:1(S:0)(IDX:3),shard:2(0/8) "
            "MinCPUsNode=1 TresPerNode=gres:gpu:2")


def test_parse_slurms_description_of_a_job():
    job = parse_show_job(SHOW_JOB)
    assert (job.job_id, job.user_id, job.state) == ("3", 1500, "RUNNING")
    assert job.gpus_by_node == {"n1": {0, 1}, "n2": {0, 1}, "n3": {3}}
    assert job.gpus_on("n4") is None
    cpu = parse_show_job("JobId=4 UserId=bob(7) JobState=RUNNING\n   Nodes=n1 CPU_IDs=0 Mem=0 GRES=\n")
    assert cpu.gpus_on("n1") == frozenset()
    pending = parse_show_job("JobId=5 UserId=bob(7) JobState=PENDING NodeList=(null)")
    assert pending.gpus_by_node == {}
    for bad in ("", "JobId=3 JobState=RUNNING", "JobId=3 UserId=x(1) JobState=RUNNING "
                "Nodes=n[1-x] CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)"):
        with pytest.raises(ValueError):
            parse_show_job(bad)
    assert parse_gres_gpus("gpu:2(IDX:0-1),gpu:v100:1(IDX:5)") == {0, 1, 5}
    assert parse_gres_gpus("gpu:0(IDX:N/A)") == frozenset()
    assert parse_index_list("0-2,7") == {0, 1, 2, 7}
    for bad in ("1-0", "0-99999999", "a", "0,,1", "0-70000"):
        with pytest.raises(ValueError):
            parse_index_list(bad)


def _proc(root: Path, pid: int, comm: str, ppid: int, uid: int, cmdline: str,
          cgroup: str = "0::/\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cmdline").write_text(cmdline.replace(" ", "\0") if comm != "slurmstepd" else cmdline)
    (d / "cgroup").write_text(cgroup)


def test_a_callers_job_comes_from_its_root_slurmstepd_or_its_slurm_cgroup(tmp_path):
    """Only a root ``slurmstepd`` ancestor or a cgroup path that only root can make counts:
    a user's process renamed ``slurmstepd: [99.batch]`` or a user-delegated cgroup named
    ``job_99`` does not."""
    p = tmp_path
    _proc(p, 100, "slurmstepd", 1, 0, "slurmstepd: [42.batch]")
    _proc(p, 101, "slurm_script", 100, 1500, "/bin/sh script")
    _proc(p, 102, "python", 101, 1500, "python train.py")
    _proc(p, 200, "slurmstepd", 1, 1500, "slurmstepd: [99.batch]")   # the user's own fake
    _proc(p, 201, "python", 200, 1500, "python")
    _proc(p, 300, "slurmstepd", 1, 0, "slurmstepd: [43+1.0]")       # het job component
    _proc(p, 301, "python", 300, 1500, "python")
    _proc(p, 400, "python", 1, 1500, "python")                      # double-forked away
    assert job_by_stepd(102, str(p)) == "42" and job_by_stepd(101, str(p)) == "42"
    assert job_by_stepd(201, str(p)) is None
    assert job_by_stepd(301, str(p)) == "43"
    assert job_by_stepd(400, str(p)) is None and job_by_stepd(999, str(p)) is None
    for cg, job in [("4:memory:/slurm/uid_1500/job_42/step_batch/task_0\n", "42"),
                    ("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n", "42"),
                    ("0::/slurmstepd.scope/job_42/step_extern\n", "42"),
                    ("0::/user.slice/user-1500.slice/user@1500.service/a.slice/slurmstepd.scope"
                     "/job_99/step_0\n", None),
                    ("0::/user.slice/user-1500.slice/session-3.scope\n", None),
                    ("4:memory:/user/slurm/uid_1500/job_99/\n", None)]:
        _proc(p, 500, "python", 1, 1500, "python", cg)
        assert job_by_cgroup(500, str(p)) == job, cg
        shutil.rmtree(p / "500")
    jd = JobDirectory(SlurmCLI(), proc=str(p))
    _proc(p, 600, "python", 1, 1500, "python", "0::/system.slice/slurmstepd.scope/job_44/step_0\n")
    assert jd.job_of(102) == "42" and jd.job_of(600) == "44" and jd.job_of(400) is None


def test_job_lookups_are_cached_briefly_and_bounded(tmp_path):
    calls = []

    class CLI:
        scontrol = "scontrol"

        def run(self, argv):
            calls.append(argv[-1])
            if argv[-1] == "404":
                from offcut.slurm_plugin.slurm_json import SlurmCommandError
                raise SlurmCommandError("scontrol exited with status 1: slurm_load_jobs error: "
                                        "Invalid job id specified")
            return SHOW_JOB.replace("JobId=3", f"JobId={argv[-1]}")

    jd = JobDirectory(CLI(), ttl_s=60, max_entries=2)
    assert jd.job("3").user_id == 1500 and jd.job("3").user_id == 1500
    assert jd.job("404") is None and jd.job("404") is None
    assert calls == ["3", "404"]
    jd.job("5")  # a third job pushes out the least recently used ("3")
    jd.job("3")
    assert calls == ["3", "404", "5", "3"]
    jd.forget("3")
    jd.job("3")
    assert calls[-1] == "3" and len(calls) == 5
    with pytest.raises(ValueError):
        jd.job("3; rm -rf /")


def test_the_stand_in_is_checked_and_named_clearly(tmp_path):
    with pytest.raises(ValueError, match="neither 'nvml' nor 'fake:FILE'"):
        open_backend("fake:")
    with pytest.raises(ValueError, match=r"gpus\[0\].max_power_limit_mw"):
        write_stand_in(tmp_path / "g.json", [dict(GPU, max_power_limit_mw=MIN_MW - 1)])
    with pytest.raises(ValueError, match="default_power_limit_mw"):
        write_stand_in(tmp_path / "g.json", [dict(GPU, default_power_limit_mw=MAX_MW + 1)])
    with pytest.raises(ValueError, match="gpus: expected a list"):
        write_stand_in(tmp_path / "g.json", [])
    b = open_backend(f"fake:{write_stand_in(tmp_path / 'g.json', [GPU])}")
    for _ in range(1005):
        b.set_limit(0, 200_000, by="t")
    assert len(b.calls()) == 1000  # the record of sets is bounded


def test_nvml_without_a_gpu_says_why(shared_dir):
    """On a machine without NVIDIA's driver the NVML backend (and the helper with it) stops
    with the reason, and nothing listens."""
    from offcut.slurm_plugin.gpu_backends import GpuError

    try:
        open_backend("nvml").close()
    except GpuError as exc:
        assert "nvidia-ml-py is not installed" in str(exc) or "NVML could not start" in str(exc)
    else:
        pytest.skip("this machine has NVML and a GPU")
    sock = shared_dir / "run" / "p.sock"
    proc = subprocess.run([sys.executable, "-m", "offcut.slurm_plugin.cli", "power-helper",
                           "--gpus", "nvml", "--socket", str(sock)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and ("NVML" in proc.stderr or "root" in proc.stderr)
    assert not sock.exists()


def test_the_power_helper_command_serves_and_stops_on_sigterm(shared_dir):
    """``offcut-slurm power-helper`` as a site runs it (stand-in GPUs): it listens with mode
    0666, answers, refuses a second helper on the same socket, replaces the stale socket of a
    killed one, and on SIGTERM stops and removes its socket."""
    stand_in = write_stand_in(shared_dir / "gpus.json", [GPU])
    sock = shared_dir / "run" / "power.sock"
    argv = [sys.executable, "-m", "offcut.slurm_plugin.cli", "power-helper", "--gpus",
            f"fake:{stand_in}", "--socket", str(sock), "--node", "n1", "--state",
            str(shared_dir / "records.json")]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, "the helper's socket", 60)
        assert proc.poll() is None, proc.stderr.read()
        assert os.stat(sock).st_mode & 0o777 == 0o666
        with http(str(sock)) as c:
            assert c.get("/discover").json()["gpus"][0]["id"] == 0
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and "another process is listening" in second.stderr
        proc.kill()  # a helper killed hard leaves its socket: the next one replaces it
        proc.wait(30)
        assert sock.exists()
        proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)

        def answers() -> bool:
            """The new helper answers on the replaced socket (or it exited)."""
            if proc.poll() is not None:
                return True
            try:
                with http(str(sock)) as c:
                    return c.get("/time").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answers, "the restarted helper's answer", 60)
        assert proc.poll() is None, proc.stderr.read()
        proc.terminate()
        assert proc.wait(30) == 0
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_the_nvml_backend_maps_nvml_calls_and_errors(monkeypatch):
    """NvmlBackend on a stand-in ``pynvml`` module (no GPU here): the right NVML calls in mW,
    and NVML's no-permission / invalid-argument errors as 403 / 400 (zeusd's mapping)."""
    import types

    from offcut.slurm_plugin.gpu_backends import GpuError, NvmlBackend

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    limits = {0: 300_000}
    nv = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_NO_PERMISSION=4, NVML_ERROR_INVALID_ARGUMENT=2,
        NVML_ERROR_NOT_SUPPORTED=3, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:19:00.0"),
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 123_456,
        nvmlDeviceGetPowerUsage=lambda h: 88_000,
        nvmlDeviceGetPowerManagementLimitConstraints=lambda h: (200_000, 700_000),
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 700_000,
        nvmlDeviceGetPowerManagementLimit=lambda h: limits[h[1]])

    def set_limit(h, mw):
        if mw == 1:
            raise NVMLError(4)
        if mw < 200_000:
            raise NVMLError(2)
        limits[h[1]] = mw

    nv.nvmlDeviceSetPowerManagementLimit = set_limit
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    b = NvmlBackend()
    assert b.count() == 1 and b.info(0).name == "NVIDIA H200"
    assert b.info(0).pci_address == "00000000:19:00.0" and b.info(0).cumulative_energy_available
    assert (b.constraints(0), b.default_limit(0), b.energy_mj(0), b.power_mw(0)) == (
        (200_000, 700_000), 700_000, 123_456, 88_000)
    b.set_limit(0, 450_000)
    assert b.get_limit(0) == 450_000
    for mw, status in ((1, 403), (100_000, 400)):
        with pytest.raises(GpuError) as err:
            b.set_limit(0, mw)
        assert err.value.status == status
    with pytest.raises(GpuError) as err:
        b.get_limit(1)
    assert err.value.status == 400
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    with pytest.raises(GpuError, match="nvidia-ml-py is not installed"):
        NvmlBackend()
