"""Pure functions that turn Slurm's JSON (``sinfo --json``, ``squeue --json``, or pyslurm
records) into node and job records, and decide which nodes Offcut may use.

Tolerant across Slurm versions (docs/architecture.md, "Slurm integration"):

* nodes: 22.05 (openapi v0.0.38) gives ``{"nodes": [{"name", "state": "idle",
  "state_flags": ["DRAIN"], "partitions": [...]}]}``; 23.02+ gives ``"state": ["IDLE", "DRAIN"]``;
  23.11+ ``sinfo --json`` groups nodes in ``{"sinfo": [{"nodes": {"nodes": [names]},
  "node": {"state": [...]}, "partition": {"name"}}]}``; ``scontrol``/pyslurm spell states
  ``"IDLE+DRAIN"``, and the short forms carry suffixes (``idle*``, ``idle~``, ``mix#``,
  ``idle%``, ``drng``, ``plnd``). All of them normalise to a set of upper-case tokens.
* node GPUs and features (:attr:`NodeInfo.gpus`, :attr:`NodeInfo.features`): 22.05 node
  records have ``"gres": "gpu:1"`` and comma strings ``"features": "a100,ib"``,
  ``"active_features": "a100,ib"`` (``""`` when none; measured on the 22.05 test cluster);
  23.02+ node records (``scontrol``/slurmrestd) give the features as lists
  (``["a100", "ib"]``, ``[]`` when none) and ``gres`` still as a string; the grouped rows of
  23.11+ ``sinfo --json`` nest them, ``"features": {"total": "a100,ib", "active": "a100,ib"}``
  and ``"gres": {"total": "gpu:a100:4(S:0-1)", "used": ...}``; pyslurm has ``gres`` as a list
  of strings and ``features_active``. GRES strings are read by :func:`gpu_count`.
* jobs: ``job_state`` a string or a list; ``nodes`` a hostlist string (else
  ``job_resources.nodes`` as a string or ``{"list": ...}``/``{"allocation": [{"name"}]}``, or
  ``job_resources.allocated_nodes[].nodename``); numbers either plain or
  ``{"set": true, "infinite": false, "number": N}``.

The idle rule (:func:`idle_nodes`): a node is idle for Offcut when Slurm has it IDLE, or
ALLOCATED/MIXED only by Offcut's own jobs (:class:`OwnJobRule`) that are not being preempted,
it carries no excluding flag (:data:`EXCLUDING`: down, drained/draining, reserved, maintenance,
not responding, powered down/powering, planned, failing, reboot ...), and it belongs to one of
the scavenger partitions when the record says which partitions it is in. A flag this module
does not know excludes the node too (and is named in the reason), so a new Slurm state can
only make Offcut use fewer nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from offcut.slurm_plugin.nodelist import NodeListError, expand_nodelist
from offcut.slurm_values import reported_errors, slurm_number


class SlurmError(Exception):
    """Slurm could not be asked, or answered something unusable."""


class SlurmCommandError(SlurmError):
    """A Slurm command could not run, failed, or timed out."""


class SlurmDataError(SlurmError):
    """Slurm's answer is not the JSON shape this module understands."""


# ----------------------------------------------------------------------------- node states
#: Short state names of ``sinfo``'s compact form -> the long names of the JSON forms.
SHORT_NAMES = {
    "ALLOC": "ALLOCATED", "MIX": "MIXED", "DRNG": "DRAINING", "RESV": "RESERVED",
    "MAINT": "MAINTENANCE", "PLND": "PLANNED", "COMP": "COMPLETING", "UNK": "UNKNOWN",
    "INVAL": "INVALID", "FUTR": "FUTURE", "FAILG": "FAILING", "NPC": "PERFCTRS",
    "POW_DN": "POWER_DOWN", "POW_UP": "POWERING_UP", "BLOCK": "BLOCKED", "BOOT": "REBOOT_ISSUED",
    "NO_RESPOND": "NOT_RESPONDING", "DRAINED": "DRAINED", "DRAIN": "DRAIN",
}
#: Suffix characters of the compact form -> the flag they stand for.
SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
    "!": "POWER_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
IDLE_BASE = frozenset({"IDLE"})
BUSY_BASE = frozenset({"ALLOCATED", "MIXED"})
#: Tokens that make a node unusable for Offcut whatever its jobs.
EXCLUDING = frozenset({
    "DOWN", "DRAIN", "DRAINED", "DRAINING", "RESERVED", "MAINTENANCE", "NOT_RESPONDING",
    "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "POWERING_UP", "POWER_UP", "POWER_DRAIN",
    "PLANNED", "FAIL", "FAILING", "FUTURE", "UNKNOWN", "ERROR", "INVALID", "INVALID_REG",
    "REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT_CANCEL", "BLOCKED", "PERFCTRS",
    "NO_RESPOND", "END",
})
#: Tokens that change nothing for Offcut.
BENIGN = frozenset({"COMPLETING", "CLOUD", "DYNAMIC_NORM", "EXTERNAL", "RESUME", "POWERED_UP"})
KNOWN_NODE_TOKENS = IDLE_BASE | BUSY_BASE | EXCLUDING | BENIGN

_SPLIT = re.compile(r"[+,\s|]+")


def state_tokens(*values: Any) -> frozenset[str]:
    """Normalise node or job state values (strings like ``"idle*"``/``"IDLE+DRAIN"``, lists of
    them, or None) into upper-case long tokens: ``"drng"`` -> {DRAINING, DRAIN},
    ``"idle~"`` -> {IDLE, POWERED_DOWN}.

    Raises:
        SlurmDataError: a value that is neither text, a list of values, nor None.
    """
    out: set[str] = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if v is None:
            continue
        if isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
            continue
        if not isinstance(v, str):
            raise SlurmDataError(f"state value {v!r} is not a string")
        for tok in _SPLIT.split(v.strip()):
            while tok and tok[-1] in SUFFIX_FLAGS:
                out.add(SUFFIX_FLAGS[tok[-1]])
                tok = tok[:-1]
            if not tok:
                continue
            tok = tok.upper()
            tok = SHORT_NAMES.get(tok, tok)
            out.add(tok)
            if tok in ("DRAINING", "DRAINED"):
                out.add("DRAIN")
    return frozenset(out)


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class NodeInfo:
    """One node as Slurm reports it."""

    name: str
    states: frozenset[str]
    partitions: frozenset[str] | None = None  # None: the record did not say
    reason: str = ""
    address: str = ""  # NodeAddr ("" when the record did not say)
    gpus: int = 0  # ``gpu`` GRES of the node, all types together (:func:`gpu_count`)
    #: the node's active features (else its available ones when the record has no active
    #: ones), in Slurm's order, without duplicates; () when none or not said
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobInfo:
    """One job as ``squeue`` reports it (only what the idle rule needs)."""

    job_id: str
    name: str = ""
    partition: str = ""
    states: frozenset[str] = frozenset()
    nodes: tuple[str, ...] = ()
    comment: str = ""
    preempt_time: float = 0.0
    user: str = ""
    submit_time: float = 0.0  # [s since epoch]; 0 when the record did not say
    exit_code: int = 0  # the batch script's return code (0 while it runs)
    signal: int = 0     # the signal that ended the batch script (0: none)
    uid: int | None = None  # the job's user id (squeue user_id, sacct UID); None: not said

    @property
    def being_preempted(self) -> bool:
        """Slurm decided to preempt it (``preempt_time`` is set as soon as that happens)."""
        return self.preempt_time > 0

    @property
    def holds_nodes(self) -> bool:
        """Whether the job occupies :attr:`nodes` now (running, configuring, completing,
        suspended ...); pending and finished jobs hold nothing."""
        if not self.nodes:
            return False
        s = self.states
        if s & {"COMPLETING", "CONFIGURING"}:
            return True
        if "PENDING" in s or s & FINISHED_JOB_STATES:
            return False
        return True  # RUNNING, SUSPENDED, and anything unknown: assume it holds them


FINISHED_JOB_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})


def number(v: Any, what: str = "value") -> float:
    """A Slurm number (:func:`offcut.slurm_values.slurm_number`: plain, a numeric string, or
    ``{"set", "infinite", "number"}``; 0 when unset, ``math.inf`` when infinite).

    Raises:
        SlurmDataError: a string that is not a number, or a value of another type.
    """
    return slurm_number(v, what, SlurmDataError)


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping):  # e.g. slurmdb's {"job": ..., "administrator": ..., "system": ...}
        return _text(v.get("job"))
    return str(v)


def _names(v: Any, what: str) -> list[str]:
    """Node names from a hostlist string or a list of names/records."""
    if v is None:
        return []
    if isinstance(v, str):
        if not v.strip() or v.strip() in ("(null)", "None"):
            return []
        try:
            return expand_nodelist(v)
        except NodeListError as exc:
            raise SlurmDataError(f"{what}: {exc}") from None
    if isinstance(v, (list, tuple)):
        out: list[str] = []
        for item in v:
            if isinstance(item, str):
                out.extend(_names(item, what))
            elif isinstance(item, Mapping):
                name = item.get("name", item.get("nodename"))
                if isinstance(name, str) and name:
                    out.append(name)
                else:
                    raise SlurmDataError(f"{what}: entry {item!r:.60} has no node name")
            else:
                raise SlurmDataError(f"{what}: entry {item!r:.60} is not a node name")
        return out
    raise SlurmDataError(f"{what}: {v!r:.60} is neither a hostlist nor a list")


def _check_errors(doc: Any, command: str) -> Mapping:
    if not isinstance(doc, Mapping):
        raise SlurmDataError(f"{command}: the answer is a JSON {type(doc).__name__}, not an object")
    errors = reported_errors(doc)
    if errors:
        raise SlurmDataError(f"{command} reported errors: {errors}")
    return doc


_GRES_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_GRES_TYPE = re.compile(r"[^\s:,()]+")
_GRES_COUNT = re.compile(r"(\d+)([KMGTP]?)")
_GRES_SUFFIX = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}


def _split_gres(gres: str) -> list[str]:
    """Split a GRES string at the commas outside parentheses (``(S:0,2)`` stays whole)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(gres):
        if ch == "(":
            depth += 1
            if depth > 1:
                raise SlurmDataError(f"gres {gres[:80]!r}: nested parentheses")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SlurmDataError(f"gres {gres[:80]!r}: unbalanced parentheses")
        elif ch == "," and depth == 0:
            items.append(gres[start:i])
            start = i + 1
    if depth:
        raise SlurmDataError(f"gres {gres[:80]!r}: unbalanced parentheses")
    items.append(gres[start:])
    return items


def gpu_count(gres: str | None) -> int:
    """How many ``gpu`` GRES a Slurm GRES string names, summed over all types.

    The format (a node's ``Gres`` in ``sinfo``, ``scontrol`` and their JSON, Slurm 22.05 to
    24.x): a comma list of ``name[:type][:count][(detail)]`` items, e.g. ``gpu:1``,
    ``gpu:a100:4``, ``gpu:a100:4(S:0-1)`` (the sockets, possibly ``(S:0,2)``),
    ``gpu:a100:2,gpu:v100:1`` (3), ``gpu:2,mps:100`` (2), ``gpu:1g.10gb:7`` (MIG types).
    A count is decimal digits with an optional ``K``/``M``/``G``/``T``/``P`` suffix (x1024
    each, Slurm's rule); an item without count counts 1 (``gpu``, ``gpu:a100``, as in
    slurm.conf); with two fields, one that starts with a digit is a count, else a type.
    Other GRES (``mps``, ``shard``, ``nic`` ...) are checked but not counted. ``None``,
    ``""``, ``"(null)"`` and ``"N/A"`` mean no GRES: 0.

    Raises:
        SlurmDataError: not a string, or an item that does not read so: an empty item or
            name, more than three fields, a count that is not a number (``gpu:a100:x``,
            ``gpu:1.5``, ``gpu:-1``), or unbalanced parentheses.
    """
    if gres is None:
        return 0
    if not isinstance(gres, str):
        raise SlurmDataError(f"gres {gres!r:.60} is not a string")
    text = gres.strip()
    if text in ("", "(null)", "N/A"):
        return 0
    total = 0
    for raw in _split_gres(text):
        shown = item = raw.strip()
        if "(" in item:  # the detail: (S:0-1), (IDX:0,2), (IDX:N/A)
            if item.count("(") > 1 or not item.endswith(")"):
                raise SlurmDataError(f"gres item {shown[:60]!r}: text after its '(...)'")
            item = item[:item.index("(")]
        fields = item.split(":")
        if not item or len(fields) > 3:
            raise SlurmDataError(f"gres item {shown[:60]!r} of {text[:80]!r} is not "
                                 "name[:type][:count]")
        name, count_text = fields[0], None
        if not _GRES_NAME.fullmatch(name):
            raise SlurmDataError(f"gres item {shown[:60]!r}: bad name {name!r}")
        if len(fields) == 3:
            if not _GRES_TYPE.fullmatch(fields[1]):
                raise SlurmDataError(f"gres item {shown[:60]!r}: bad type {fields[1]!r}")
            count_text = fields[2]
        elif len(fields) == 2 and (not fields[1] or fields[1][0] in "0123456789+-."):
            count_text = fields[1]  # else a type without count
        if count_text is None:
            count = 1
        else:
            m = _GRES_COUNT.fullmatch(count_text)
            if not m:
                raise SlurmDataError(f"gres item {shown[:60]!r}: count {count_text!r} is not "
                                     "a number")
            count = int(m.group(1)) * _GRES_SUFFIX[m.group(2)]
        if name == "gpu":
            total += count
    return total


def _gres_text(v: Any, what: str) -> str:
    """A node's GRES as one string: a string, a list of strings (pyslurm), or the
    ``{"total": ..., "used": ...}`` of 23.11+ grouped ``sinfo`` rows (the total)."""
    if v is None or isinstance(v, str):
        return v or ""
    if isinstance(v, Mapping):
        return _gres_text(v.get("total"), what)
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return ",".join(x for x in v if x.strip())
    raise SlurmDataError(f"{what} {v!r:.60} is neither a string nor a list of strings")


def _feature_list(v: Any, what: str) -> tuple[str, ...]:
    """Features from a comma string (22.05; ``""``/``"(null)"``: none) or a list of strings
    (23.02+), stripped, in order, without duplicates."""
    if v is None:
        return ()
    if isinstance(v, str):
        items = v.split(",")
    elif isinstance(v, (list, tuple)):
        items = []
        for x in v:
            if not isinstance(x, str):
                raise SlurmDataError(f"{what}: entry {x!r:.40} is not a string")
            items.extend(x.split(","))
    else:
        raise SlurmDataError(f"{what} {v!r:.60} is neither a comma string nor a list")
    out: dict[str, None] = {}
    for item in items:
        item = item.strip()
        if item and item != "(null)":
            out.setdefault(item, None)
    return tuple(out)


def _node_features(rec: Mapping, what: str = "features") -> tuple[str, ...]:
    """A node record's active features when it has them (``active_features``, pyslurm's
    ``features_active``, or ``features.active`` of grouped rows; present, even if empty,
    counts), else its available ones (``features``, ``features.total``)."""
    feats = rec.get("features")
    if isinstance(feats, Mapping):  # 23.11+ grouped sinfo rows
        active, total = feats.get("active"), feats.get("total")
    else:
        active = rec.get("active_features", rec.get("features_active"))
        total = feats
    if active is not None:
        return _feature_list(active, f"{what} (active)")
    return _feature_list(total, what)


def parse_nodes(doc: Any) -> dict[str, NodeInfo]:
    """Nodes of a ``sinfo --json`` answer (any of the shapes in the module docstring), by name.

    A node's :attr:`~NodeInfo.gpus` and :attr:`~NodeInfo.features` come from its ``gres``
    and ``active_features``/``features`` (module docstring); a node listed several times
    (one grouped row per partition) keeps the largest GPU count and the first non-empty
    features.

    Raises:
        SlurmDataError: not an object, Slurm-reported errors, no node list, a node without a
            name, a state that is not text, a GRES string :func:`gpu_count` cannot read or
            features that are neither a comma string nor a list of strings (naming the
            node), or no node at all (an empty cluster is treated as bad data, so that a
            glitch never empties the daemon's idle pool).
    """
    doc = _check_errors(doc, "sinfo")
    merged: dict[str, dict] = {}

    def add(name: Any, states: frozenset[str], partitions: Iterable[str] | None, reason: str,
            address: Any = "", rec: Mapping | None = None):
        if not isinstance(name, str) or not name:
            raise SlurmDataError(f"sinfo: a node record has no name ({name!r:.40})")
        m = merged.setdefault(name, {"states": set(), "partitions": None, "reason": "",
                                     "address": "", "gpus": 0, "features": ()})
        m["states"] |= states
        if partitions is not None:
            m["partitions"] = (m["partitions"] or set()) | set(partitions)
        m["reason"] = m["reason"] or reason
        m["address"] = m["address"] or (address if isinstance(address, str) else "")
        if rec is not None:
            try:
                gpus = gpu_count(_gres_text(rec.get("gres"), "gres"))
                features = _node_features(rec)
            except SlurmDataError as exc:
                raise SlurmDataError(f"sinfo: node {name!r}: {exc}") from None
            m["gpus"] = max(m["gpus"], gpus)
            m["features"] = m["features"] or features

    if isinstance(doc.get("nodes"), list):
        for rec in doc["nodes"]:
            if not isinstance(rec, Mapping):
                raise SlurmDataError(f"sinfo: node record {rec!r:.60} is not an object")
            states = state_tokens(rec.get("state"), rec.get("state_flags"))
            if not states:
                raise SlurmDataError(f"sinfo: node {rec.get('name')!r} has no state")
            parts = rec.get("partitions")
            if isinstance(parts, str):
                parts = [p for p in parts.split(",") if p]
            elif parts is not None and not isinstance(parts, list):
                raise SlurmDataError(f"sinfo: partitions of {rec.get('name')!r} is {parts!r:.40}")
            add(rec.get("name"), states, parts, _text(rec.get("reason")), rec.get("address"),
                rec)
    elif isinstance(doc.get("sinfo"), list):
        for row in doc["sinfo"]:
            if not isinstance(row, Mapping):
                raise SlurmDataError(f"sinfo: row {row!r:.60} is not an object")
            nodes = row.get("nodes")
            names = _names(nodes.get("nodes") if isinstance(nodes, Mapping) else nodes, "sinfo row nodes")
            node = row.get("node") if isinstance(row.get("node"), Mapping) else {}
            states = state_tokens(node.get("state"), row.get("state"))
            if names and not states:
                raise SlurmDataError("sinfo: a row of nodes has no state")
            part = row.get("partition")
            pname = part.get("name") if isinstance(part, Mapping) else part
            parts = [pname] if isinstance(pname, str) and pname else None
            reason = row.get("reason")
            reason = _text(reason.get("description") if isinstance(reason, Mapping) else reason)
            for name in names:
                add(name, states, parts, reason, rec=row)
    else:
        raise SlurmDataError("sinfo: the answer has neither a 'nodes' nor a 'sinfo' list "
                             f"(keys: {sorted(doc)[:8]})")
    if not merged:
        raise SlurmDataError("sinfo: the answer lists no node")
    return {n: NodeInfo(n, frozenset(m["states"]),
                        None if m["partitions"] is None else frozenset(m["partitions"]),
                        m["reason"], m["address"], m["gpus"], m["features"])
            for n, m in merged.items()}


def _job_nodes(rec: Mapping) -> list[str]:
    """The nodes a job holds now. ``nodes`` wins when present: for a completing job it lists
    only the nodes still completing ("" once all are released, measured on 22.05), while
    ``job_resources`` keeps the whole allocation."""
    jid = rec.get("job_id")
    if "nodes" in rec and not isinstance(rec["nodes"], Mapping):
        return _names(rec["nodes"], f"squeue: nodes of job {jid}")
    res = rec.get("job_resources")
    if isinstance(rec.get("nodes"), Mapping):
        res = {"nodes": rec["nodes"]}
    if isinstance(res, Mapping):
        n = res.get("nodes")
        if isinstance(n, Mapping):
            if "list" in n:
                return _names(n["list"], f"squeue: job_resources.nodes.list of job {jid}")
            if "allocation" in n:
                return _names(n["allocation"], f"squeue: job_resources.nodes.allocation of job {jid}")
        elif isinstance(n, str):
            return _names(n, f"squeue: job_resources.nodes of job {jid}")
        if "allocated_nodes" in res:
            return _names(res["allocated_nodes"], f"squeue: allocated_nodes of job {jid}")
    return []


def parse_jobs(doc: Any) -> list[JobInfo]:
    """Jobs of a ``squeue --json`` answer.

    Raises:
        SlurmDataError: not an object, Slurm-reported errors, no ``jobs`` list, a job without
            an id or state, or a node list that is not a hostlist.
    """
    doc = _check_errors(doc, "squeue")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmDataError(f"squeue: the answer has no 'jobs' list (keys: {sorted(doc)[:8]})")
    out = []
    for rec in jobs:
        if not isinstance(rec, Mapping):
            raise SlurmDataError(f"squeue: job record {rec!r:.60} is not an object")
        jid = rec.get("job_id", rec.get("id"))
        if isinstance(jid, Mapping):
            jid = number(jid, "job_id")
        if isinstance(jid, float):
            jid = int(jid)
        if jid is None or jid == "":
            raise SlurmDataError("squeue: a job record has no job_id")
        states = state_tokens(rec.get("job_state", rec.get("state")))
        if not states:
            raise SlurmDataError(f"squeue: job {jid} has no state")
        user = rec.get("user_name", rec.get("user", ""))
        uid = rec.get("user_id")
        uid = None if uid is None or uid == "" else int(number(uid, f"user_id of job {jid}"))
        code, sig = _exit_status(rec.get("exit_code"))
        out.append(JobInfo(
            job_id=str(jid), name=_text(rec.get("name")), partition=_text(rec.get("partition")),
            states=states, nodes=tuple(_job_nodes(rec)), comment=_text(rec.get("comment")),
            preempt_time=number(rec.get("preempt_time"), f"preempt_time of job {jid}"),
            submit_time=number(rec.get("submit_time"), f"submit_time of job {jid}"),
            user=_text(user), exit_code=code, signal=sig, uid=uid))
    return out


def _exit_status(v: Any) -> tuple[int, int]:
    """A job's ``(return code, signal)``: from a plain number, the wait status of 22.05
    (``code << 8 | signal``: exit 75 reads 19200, measured on 22.05.8), or from
    ``{"return_code": N, "signal": {"id": M}, "status": [...]}`` (23.02+, numbers possibly as
    ``{"number": N}``); ``(0, 0)`` when absent or unreadable."""
    def value(x: Any) -> int:
        if isinstance(x, Mapping):
            x = x.get("number", x.get("id", 0))
            if isinstance(x, Mapping):
                x = x.get("number", 0)
        try:
            return int(number(x, "exit_code"))
        except (SlurmDataError, ValueError, OverflowError, TypeError):
            return 0

    if isinstance(v, Mapping):
        sig = v.get("signal")
        return value(v.get("return_code", 0)), value(sig.get("id", 0) if isinstance(sig, Mapping) else sig)
    status = value(v)
    return (status >> 8) & 0xFF, status & 0x7F


# ----------------------------------------------------------------------------- the idle rule
@dataclass(frozen=True)
class OwnJobRule:
    """Which Slurm jobs are Offcut's own (their nodes still count as idle).

    A job is Offcut's when it runs in one of ``partitions`` (empty: any partition), its name
    starts with ``name_prefix`` (empty: any name), and its comment contains ``comment_marker``
    (empty: any comment). The default, every job of the ``scavenger`` partition, suits a site
    where only Offcut uses that partition; where others use it too, give the launcher's job-name
    prefix or comment marker.
    """

    partitions: frozenset[str] = frozenset({"scavenger"})
    name_prefix: str = ""
    comment_marker: str = ""

    def matches(self, job: JobInfo) -> bool:
        """Whether ``job`` is one of Offcut's (a job in several partitions, ``"a,b"``, needs
        one of them in :attr:`partitions`)."""
        if self.partitions and not (set(job.partition.split(",")) & self.partitions):
            return False
        if self.name_prefix and not job.name.startswith(self.name_prefix):
            return False
        if self.comment_marker and self.comment_marker not in job.comment:
            return False
        return True


@dataclass
class IdleView:
    """The result of the idle rule: ``idle`` (sorted names) and why every other node is not."""

    idle: list[str]
    not_idle: dict[str, str] = field(default_factory=dict)
    unknown_tokens: set[str] = field(default_factory=set)

    @property
    def total(self) -> int:
        """How many nodes Slurm reported (idle or not)."""
        return len(self.idle) + len(self.not_idle)


def idle_nodes(nodes: Mapping[str, NodeInfo], jobs: Iterable[JobInfo], rule: OwnJobRule,
               node_partitions: Iterable[str] = (), ignore_job_ids: Iterable[str] = ()) -> IdleView:
    """Apply the idle rule (module docstring).

    Args:
        nodes: from :func:`parse_nodes`.
        jobs: from :func:`parse_jobs`.
        rule: which jobs are Offcut's.
        node_partitions: a node must be in one of these to count (when its record lists its
            partitions); empty: no partition filter.
        ignore_job_ids: jobs to disregard (the epilog's own, ending job).
    """
    ignore = {str(j) for j in ignore_job_ids}
    wanted_parts = set(node_partitions)
    holders: dict[str, list[JobInfo]] = {}
    for job in jobs:
        if job.job_id in ignore or not job.holds_nodes:
            continue
        for n in job.nodes:
            holders.setdefault(n, []).append(job)
    view = IdleView(idle=[])
    for name in sorted(nodes):
        node = nodes[name]
        s = node.states
        unknown = s - KNOWN_NODE_TOKENS
        reason = ""
        if unknown:
            view.unknown_tokens |= unknown
            reason = f"unknown state {'+'.join(sorted(unknown))}"
        elif s & EXCLUDING:
            reason = "+".join(sorted(s & EXCLUDING)).lower()
            if node.reason:
                reason += f" ({node.reason})"
        elif wanted_parts and node.partitions is not None and not (node.partitions & wanted_parts):
            reason = f"not in partition {'/'.join(sorted(wanted_parts))}"
        else:
            on_it = holders.get(name, [])
            foreign = [j for j in on_it if not rule.matches(j)]
            leaving = [j for j in on_it if rule.matches(j) and j.being_preempted]
            if foreign:
                reason = f"job {foreign[0].job_id} ({foreign[0].partition or '?'})"
            elif leaving:
                reason = f"Offcut job {leaving[0].job_id} is being preempted"
            elif s & IDLE_BASE:
                pass
            elif s & BUSY_BASE:
                if not on_it and "COMPLETING" not in s:
                    reason = "allocated, but no job seen on it"
            else:
                reason = f"state {'+'.join(sorted(s)).lower() or 'missing'}"
        if reason:
            view.not_idle[name] = reason
        else:
            view.idle.append(name)
    return view


# ----------------------------------------------------------------------------- accounting
#: the columns :meth:`offcut.slurm_plugin.slurm_cli.SlurmCLI.sacct` asks for, in order
SACCT_FIELDS = ("JobID", "JobName", "Partition", "State", "ExitCode", "NodeList", "Submit",
                "UID")


def parse_sacct(text: str) -> list[JobInfo]:
    """Jobs of ``sacct -X --parsable2 --noheader --format=`` :data:`SACCT_FIELDS` (times as
    epoch seconds, ``SLURM_TIME_FORMAT=%s``), as :class:`JobInfo` records: ``State`` such as
    ``CANCELLED by 0`` becomes ``{"CANCELLED"}``, ``ExitCode`` ``75:0`` the exit code 75 and
    signal 0, ``NodeList`` ``None assigned`` no nodes, ``UID`` the job's user id (lines of the
    former seven columns, without ``UID``, are read with the user id unknown: None).

    Raises:
        SlurmDataError: a line without the expected columns, naming it (1-based).
    """
    from offcut.parsable import NO_NODES, NO_VALUE, parsable_rows

    out = []
    legacy = len(SACCT_FIELDS) - 2  # "|" of a line without the UID column
    text = "\n".join(line + "|" if line.count("|") == legacy else line
                     for line in text.splitlines())
    try:
        records = list(parsable_rows(text, SACCT_FIELDS, "sacct"))
    except ValueError as exc:
        raise SlurmDataError(str(exc)) from None
    for number, cols in records:
        jid, name, partition, state, exit_code, nodes, submit, uid_text = cols
        if not jid.strip():
            raise SlurmDataError(f"sacct line {number}: no job id")
        code, _, sig = exit_code.partition(":")
        try:
            exit_status = (int(code or 0), int(sig or 0))
            submitted = float(submit) if submit.strip() not in NO_VALUE else 0.0
            uid = int(uid_text) if uid_text.strip() else None
        except ValueError:
            raise SlurmDataError(f"sacct line {number}: exit code {exit_code!r}, submit time "
                                 f"{submit!r} or UID {uid_text!r} is not a number "
                                 "(SLURM_TIME_FORMAT=%s)") from None
        try:
            node_names = () if nodes.strip() in NO_NODES else tuple(expand_nodelist(nodes))
        except NodeListError as exc:
            raise SlurmDataError(f"sacct line {number}: node list {nodes!r}: {exc}") from None
        out.append(JobInfo(job_id=jid.strip(), name=name, partition=partition,
                           states=state_tokens(state.split(" ")[0]), nodes=node_names,
                           submit_time=submitted, exit_code=exit_status[0],
                           signal=exit_status[1], uid=uid))
    return out
