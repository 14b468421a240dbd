"""Which Slurm job a local process belongs to, and which GPUs that job owns on this node: the
power helper's authorisation (:mod:`~offcut.slurm_plugin.power_helper`, docs/security.md,
"GPU power limits").

Every fact comes from the kernel or from Slurm, never from the process itself (its environment,
``SLURM_JOB_ID`` included, is the user's to set):

* the caller's pid and uid: ``SO_PEERCRED`` of its unix-socket connection (the helper);
* its job (:func:`job_of_pid`), by one of these methods:

  - ``stepd``: its ancestors in ``/proc``: the nearest ``slurmstepd`` that runs as root
    (real, effective, saved and filesystem uid 0; ``comm`` ``slurmstepd``) and whose title is
    ``slurmstepd: [JOB.STEP]``. A user cannot make a root process, so cannot forge it; a
    process that left the job's tree (double fork) is not found, hence refused;
  - ``cgroup``: ``/proc/PID/cgroup`` under Slurm's cgroup plugin: cgroup v1
    ``/slurm[_NODE]/uid_U/job_J/...``, cgroup v2 ``/<...>.slice/.../slurmstepd.scope/job_J/...``
    (anchored at the hierarchy's root, where only root creates folders; a user's delegated
    systemd subtree always has ``user@UID.service`` in its path, which never matches). Finds
    processes adopted into a job (``pam_slurm_adopt``) too;
  - ``scontrol``: ``scontrol pidinfo PID`` (asks the node's slurmd; with several slurmd on one
    host, as in the test cluster, it asks only one of them);
  - ``auto`` (the default): ``stepd``, then ``cgroup``;

* the job's owner, state and GPUs: ``scontrol show job -d --oneliner JOB``: ``UserId=name(UID)``,
  ``JobState=RUNNING``, and one ``Nodes=HOSTLIST CPU_IDs=... Mem=... GRES=gpu:2(IDX:0-1)``
  detail per group of nodes (:func:`parse_show_job`). The ``IDX`` values are Slurm's GRES
  indices of the node, which are the NVML indices when ``gres.conf`` has ``AutoDetect=nvml``
  or ``File=/dev/nvidia[0-N]`` lines in order (docs/deployment.md, "3d. GPU power limits: the
  power helper").

:class:`JobDirectory` caches job lookups briefly (``ttl_s``) in a bounded table
(``max_entries``, least recently used dropped).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

from offcut.slurm_plugin.slurm_json import SlurmCommandError, SlurmError
from offcut.slurm_values import NodeListError, expand_nodelist

#: GPU indices a job may have on one node, and the largest index accepted
MAX_GPUS_PER_NODE = 1024
MAX_GPU_INDEX = 65535
#: ancestors walked up from the caller looking for its slurmstepd
MAX_ANCESTORS = 128
#: bytes read from /proc/PID/{stat,status,cmdline,cgroup}
MAX_PROC_BYTES = 65536
#: characters of ``scontrol show job`` output parsed (a job with thousands of nodes)
MAX_SHOW_JOB_CHARS = 4 << 20
METHODS = ("auto", "stepd", "cgroup", "scontrol")

_STEPD_TITLE = re.compile(r"^slurmstepd: \[(\d{1,10})(?:\+\d{1,6})?\.[A-Za-z0-9_]{1,32}\]")
_CG_V1 = re.compile(r"^/slurm(?:_[^/]+)?/uid_(\d{1,10})/job_(\d{1,10})(?:/|$)")
_CG_V2 = re.compile(r"^/(?:[^/]+\.slice/)*slurmstepd\.scope/job_(\d{1,10})(?:/|$)")
_PIDINFO = re.compile(r"Slurm job id (\d{1,10})\b")
_JOB_ID = re.compile(r"(?:^|\s)JobId=(\d{1,10})(?:\s|$)")
_USER = re.compile(r"(?:^|\s)UserId=[^\s(]*\((\d{1,10})\)")
_STATE = re.compile(r"(?:^|\s)JobState=([A-Z_]+)")
_DETAIL = re.compile(r"(?:^|\s)Nodes=(\S+)\s+CPU_IDs=\S*\s+Mem=\S*\s+GRES=(\S*)")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]{1,64})?:\d{1,6}(?:\(S:[^)]*\))?\(IDX:([^)]*)\)")


class JobLookupError(Exception):
    """Slurm could not be asked about a job (slurmctld down, timeout): the helper answers
    503, never a decision."""


@dataclass(frozen=True)
class JobGpus:
    """A job as ``scontrol show job -d`` describes it: ``job_id``, its owner's ``user_id``,
    ``state`` (``RUNNING``, ``COMPLETING`` ...) and the GPU (GRES) indices it holds on each of
    its nodes (a node it runs on without GPUs maps to an empty set)."""

    job_id: str
    user_id: int
    state: str
    gpus_by_node: dict[str, frozenset[int]] = field(default_factory=dict)

    def gpus_on(self, node: str) -> frozenset[int] | None:
        """The job's GPU indices on ``node``; None when the job has no allocation there."""
        return self.gpus_by_node.get(node)


def parse_index_list(spec: str) -> frozenset[int]:
    """GRES indices ``"0-1,3"`` -> ``{0, 1, 3}`` (``"N/A"`` / empty -> empty).

    Raises:
        ValueError: malformed, an index over :data:`MAX_GPU_INDEX`, or more than
            :data:`MAX_GPUS_PER_NODE` indices.
    """
    spec = spec.strip()
    if spec in ("", "N/A"):
        return frozenset()
    out: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"(\d{1,6})(?:-(\d{1,6}))?", part.strip())
        if not m:
            raise ValueError(f"GPU index list {spec[:80]!r}: {part[:20]!r} is not N or N-M")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo or hi > MAX_GPU_INDEX or len(out) + hi - lo + 1 > MAX_GPUS_PER_NODE:
            raise ValueError(f"GPU index list {spec[:80]!r}: {part[:20]!r} is out of bounds")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def parse_gres_gpus(gres: str) -> frozenset[int]:
    """The ``gpu`` indices of a job's per-node ``GRES=`` value, e.g. ``gpu:2(IDX:0-1)``,
    ``gpu:a100:4(S:0-1)(IDX:0-3)``, ``gpu:1(IDX:0),shard:...`` (other GRES ignored).

    Raises:
        ValueError: a malformed index list (:func:`parse_index_list`).
    """
    out: set[int] = set()
    for m in _GPU_GRES.finditer(gres):
        out |= parse_index_list(m.group(1))
        if len(out) > MAX_GPUS_PER_NODE:
            raise ValueError(f"GRES {gres[:80]!r}: more than {MAX_GPUS_PER_NODE} GPUs")
    return frozenset(out)


def parse_show_job(text: str) -> JobGpus:
    """A job from ``scontrol show job -d --oneliner JOB`` (one job; the multi-line form
    works too).

    Raises:
        ValueError: no ``JobId``/``UserId``/``JobState``, or a malformed node list or GRES.
    """
    text = text[:MAX_SHOW_JOB_CHARS]
    jid, user, state = _JOB_ID.search(text), _USER.search(text), _STATE.search(text)
    if not (jid and user and state):
        raise ValueError(f"scontrol show job printed no JobId/UserId/JobState: {text[:120]!r}")
    by_node: dict[str, frozenset[int]] = {}
    for m in _DETAIL.finditer(text):
        try:
            nodes = expand_nodelist(m.group(1))
        except NodeListError as exc:
            raise ValueError(f"job {jid.group(1)}: Nodes={m.group(1)[:80]}: {exc}") from None
        gpus = parse_gres_gpus(m.group(2))
        for n in nodes:
            by_node[n] = by_node.get(n, frozenset()) | gpus
    return JobGpus(jid.group(1), int(user.group(1)), state.group(1), by_node)


# ----------------------------------------------------------------------------- pid -> job
def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_PROC_BYTES).decode("utf-8", "replace")


def _stat(pid: int, proc: str) -> tuple[str, int]:
    """``(comm, ppid)`` of ``pid`` from ``/proc/PID/stat`` (comm may hold spaces and ')')."""
    raw = _read(f"{proc}/{pid}/stat")
    lp, rp = raw.find("("), raw.rfind(")")
    if lp < 0 or rp < lp:
        raise OSError(f"{proc}/{pid}/stat is malformed")
    rest = raw[rp + 1:].split()
    return raw[lp + 1:rp], int(rest[1])


def _all_uids_root(pid: int, proc: str) -> bool:
    for line in _read(f"{proc}/{pid}/status").splitlines():
        if line.startswith("Uid:"):
            return all(v == "0" for v in line.split()[1:5]) and len(line.split()) >= 5
    return False


def job_by_stepd(pid: int, proc: str = "/proc") -> str | None:
    """The job id of the nearest root ``slurmstepd`` above ``pid`` (module docstring), else
    None (no such ancestor, or the process is gone)."""
    cur = pid
    try:
        for _ in range(MAX_ANCESTORS):
            comm, ppid = _stat(cur, proc)
            if comm == "slurmstepd" and cur != pid and _all_uids_root(cur, proc):
                title = _read(f"{proc}/{cur}/cmdline").replace("\0", " ")
                m = _STEPD_TITLE.match(title)
                if m:
                    return m.group(1)
            if ppid <= 1:
                return None
            cur = ppid
    except (OSError, ValueError, IndexError):
        return None
    return None


def job_by_cgroup(pid: int, proc: str = "/proc") -> str | None:
    """The job id in ``pid``'s Slurm cgroup (module docstring), else None."""
    try:
        text = _read(f"{proc}/{pid}/cgroup")
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        m = _CG_V1.match(path)
        if m:
            return m.group(2)
        m = _CG_V2.match(path)
        if m:
            return m.group(1)
    return None


def job_by_scontrol(pid: int, run: Callable[[list[str]], str]) -> str | None:
    """The job id ``scontrol pidinfo PID`` reports (``run``: runs a Slurm command, returns
    stdout, raises SlurmCommandError), else None (not a job's process)."""
    try:
        out = run(["scontrol", "pidinfo", str(int(pid))])
    except SlurmCommandError:
        return None
    m = _PIDINFO.search(out)
    return m.group(1) if m else None


def job_of_pid(pid: int, method: str = "auto", proc: str = "/proc",
               run: Callable[[list[str]], str] | None = None) -> str | None:
    """The Slurm job of local process ``pid`` by ``method`` (:data:`METHODS`, module
    docstring), else None. Raises ValueError for an unknown method."""
    if method not in METHODS:
        raise ValueError(f"job lookup method {method!r} is not one of {', '.join(METHODS)}")
    if method in ("auto", "stepd"):
        jid = job_by_stepd(pid, proc)
        if jid or method == "stepd":
            return jid
    if method in ("auto", "cgroup"):
        return job_by_cgroup(pid, proc)
    if run is None:
        raise ValueError("job lookup method 'scontrol' needs a Slurm command runner")
    return job_by_scontrol(pid, run)


# ----------------------------------------------------------------------------- the directory
class JobDirectory:
    """Answers "which job is this pid's, and what does that job own" with a short cache.

    Args:
        cli: an :class:`offcut.slurm_plugin.slurm_cli.SlurmCLI` (its ``scontrol`` and
            ``slurm_conf``; its timeout bounds each query).
        method: how a pid's job is found (:data:`METHODS`).
        ttl_s: how long a job's description is reused [s] (its GPUs never change while it runs;
            its end is seen within ``ttl_s``, and the node epilog's restore forgets it at once).
        max_entries: cached jobs at most (least recently used dropped).
        proc: the proc filesystem (tests may point it elsewhere).
    """

    def __init__(self, cli, method: str = "auto", ttl_s: float = 5.0, max_entries: int = 256,
                 proc: str = "/proc"):
        if method not in METHODS:
            raise ValueError(f"--job-lookup: {method!r} is not one of {', '.join(METHODS)}")
        if not ttl_s >= 0 or max_entries < 1:
            raise ValueError("ttl_s must be >= 0 and max_entries >= 1")
        self.cli, self.method, self.ttl_s, self.max_entries, self.proc = (
            cli, method, ttl_s, max_entries, proc)
        self._cache: OrderedDict[str, tuple[float, JobGpus | None]] = OrderedDict()
        self._lock = threading.Lock()

    def _run(self, argv: list[str]) -> str:
        return self.cli.run([self.cli.scontrol if argv[0] == "scontrol" else argv[0], *argv[1:]])

    def job_of(self, pid: int) -> str | None:
        """The job id of local process ``pid`` (None: not in a job)."""
        return job_of_pid(pid, self.method, self.proc, self._run)

    def job(self, job_id: str) -> JobGpus | None:
        """Job ``job_id`` as Slurm describes it now (cached ``ttl_s``); None when Slurm does not
        know it (ended long ago, or never existed).

        Raises:
            JobLookupError: Slurm could not be asked, or answered something unusable.
        """
        if not job_id.isdigit() or len(job_id) > 10:
            raise ValueError(f"job id {job_id[:20]!r} is not a number")
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(job_id)
            if hit and hit[0] > now:
                self._cache.move_to_end(job_id)
                return hit[1]
        try:
            out = self._run(["scontrol", "show", "job", "-d", "--oneliner", job_id])
            info: JobGpus | None = parse_show_job(out)
            if info.job_id != job_id:
                raise ValueError(f"asked for job {job_id}, scontrol described job {info.job_id}")
        except SlurmCommandError as exc:
            if "invalid job id" not in str(exc).lower():
                raise JobLookupError(f"cannot ask Slurm about job {job_id}: {exc}") from None
            info = None
        except (SlurmError, ValueError) as exc:
            raise JobLookupError(f"cannot read Slurm's description of job {job_id}: {exc}") from None
        with self._lock:
            self._cache[job_id] = (now + self.ttl_s, info)
            self._cache.move_to_end(job_id)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return info

    def forget(self, job_id: str) -> None:
        """Drop ``job_id``'s cached description (its end was just seen)."""
        with self._lock:
            self._cache.pop(job_id, None)
