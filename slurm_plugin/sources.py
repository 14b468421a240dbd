"""Where the watcher (and the epilog's check) read Slurm's node and job state from, and the
observation built from it.

* :class:`CLISource`: ``sinfo --json`` + ``squeue --json`` (the portable path; Slurm >= 21.08).
* :class:`PyslurmSource`: pyslurm, used only when a pyslurm whose version matches the site's
  Slurm (``sinfo --version``) is installed, a slurm.conf is reachable, and ``import pyslurm``
  survives in a throw-away probe process first (importing pyslurm without a usable Slurm
  configuration kills the whole process). Its records are turned into the JSON shapes that
  :mod:`offcut.slurm_plugin.slurm_json` parses, so both paths share one idle rule.
  Best effort: no pyslurm matches this project's Slurm 22.05 test cluster, so this adapter is
  not exercised by the test suite beyond its selection logic; any error in it falls back to
  the CLI for good (logged once).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol

from offcut.nodes import is_node_name
from offcut.parsable import NO_VALUE
from offcut.slurm_plugin.slurm_cli import SlurmCLI, default_slurm_conf
from offcut.slurm_plugin.slurm_json import (IdleView, OwnJobRule, SlurmError, idle_nodes,
                                            parse_jobs, parse_nodes)


class Source(Protocol):
    """Something that reads Slurm's node and job state; ``name`` names it in logs."""

    name: str

    def fetch(self) -> tuple[dict, dict]:
        """``(sinfo-shaped doc, squeue-shaped doc)``; raises SlurmError."""


class CLISource:
    """``sinfo --json`` and ``squeue --json``."""

    name = "sinfo/squeue --json"

    def __init__(self, cli: SlurmCLI):
        self.cli = cli

    def fetch(self) -> tuple[dict, dict]:
        """``(sinfo --json, squeue --json)``; raises SlurmError (:class:`SlurmCLI`)."""
        return self.cli.sinfo_json(), self.cli.squeue_json()


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        if isinstance(obj, dict):
            if n in obj:
                return obj[n]
        elif hasattr(obj, n):
            try:
                return getattr(obj, n)
            except Exception:  # noqa: BLE001 - a pyslurm property may raise on odd records
                continue
    return default


def _values(coll: Any) -> Iterable[Any]:
    if isinstance(coll, dict) or hasattr(coll, "values"):
        vals = list(coll.values())
        # pyslurm >= 23 collections may be keyed by cluster first: {cluster: {id: Job}}
        if vals and all(isinstance(v, dict) for v in vals) and not any(
                "job_state" in v or "state" in v for v in vals):
            return [x for v in vals for x in v.values()]
        return vals
    return list(coll)


class PyslurmSource:
    """pyslurm's node and job records (see the module docstring)."""

    name = "pyslurm"

    def __init__(self):
        import pyslurm  # noqa: F401 - guarded by pyslurm_unusable_reason()

        self.pyslurm = pyslurm

    def fetch(self) -> tuple[dict, dict]:
        """pyslurm's nodes and jobs as ``({"nodes": [...]}, {"jobs": [...]})`` in the record
        shapes :mod:`~offcut.slurm_plugin.slurm_json` parses; raises SlurmError when pyslurm
        fails."""
        m = self.pyslurm
        try:
            if hasattr(m, "Nodes"):
                nodes = m.Nodes.load() if hasattr(m.Nodes, "load") else m.Nodes()
                jobs = m.Jobs.load() if hasattr(m.Jobs, "load") else m.Jobs()
            else:  # pyslurm <= 22.5: dicts keyed by name / id
                nodes, jobs = m.node().get(), m.job().get()
        except Exception as exc:  # noqa: BLE001 - pyslurm raises its own RPCError types
            raise SlurmError(f"pyslurm: {exc.__class__.__name__}: {exc}") from None
        node_recs = []
        for n in _values(nodes):
            node_recs.append({"name": _get(n, "name"), "state": _get(n, "state"),
                              "state_flags": _get(n, "state_flags", default=None),
                              "partitions": _get(n, "partitions", default=None),
                              "reason": _get(n, "reason", default="") or "",
                              "gres": _get(n, "gres", default=None),
                              "features": _get(n, "available_features", "features",
                                               default=None),
                              "features_active": _get(n, "active_features", "features_active",
                                                      default=None)})
        job_recs = []
        for j in _values(jobs):
            preempt = _get(j, "preempt_time_raw", "preempt_time", default=0)
            if isinstance(preempt, str):  # a formatted date in some releases
                preempt = 0 if preempt.strip() in NO_VALUE else 1
            job_recs.append({"job_id": _get(j, "job_id", "id"), "name": _get(j, "name", default=""),
                             "partition": _get(j, "partition", default=""),
                             "job_state": _get(j, "job_state", "state"),
                             "nodes": _get(j, "nodes", "allocated_nodes", default="") or "",
                             "comment": _get(j, "comment", default="") or "",
                             "preempt_time": preempt or 0})
        return {"nodes": node_recs, "errors": []}, {"jobs": job_recs, "errors": []}


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def pyslurm_unusable_reason(cli: SlurmCLI, probe_timeout_s: float = 30.0) -> str | None:
    """Why pyslurm must not be used here (None: it may). Checks, in order: a pyslurm is
    installed (without importing it), its major.minor equals Slurm's (pyslurm ``22.5.x`` for
    Slurm ``22.05``), a slurm.conf is reachable, and ``import pyslurm`` survives in a probe
    subprocess."""
    from importlib import metadata

    try:
        installed = metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return "pyslurm is not installed"
    try:
        slurm = cli.version()
    except SlurmError as exc:
        return f"the Slurm version is unknown ({exc})"
    if _version_tuple(installed) != tuple(slurm[:2]):
        return (f"pyslurm {installed} does not match Slurm "
                f"{slurm[0]}.{slurm[1]:02d}.{slurm[2]}")
    conf = cli.slurm_conf or default_slurm_conf()
    if not conf or not os.path.exists(conf):
        return "no slurm.conf is reachable (SLURM_CONF unset and /etc/slurm/slurm.conf missing)"
    try:
        proc = subprocess.run([sys.executable, "-c", "import pyslurm"], env=cli.env(),
                              capture_output=True, timeout=probe_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the pyslurm import probe failed ({exc.__class__.__name__})"
    if proc.returncode != 0:
        return f"'import pyslurm' kills a probe process (status {proc.returncode})"
    return None


def choose_source(cli: SlurmCLI, mode: str, log: logging.Logger) -> Source:
    """``mode``: ``auto`` (pyslurm when usable, else the CLI; the choice is logged once),
    ``never`` (CLI), ``require`` (pyslurm or SlurmError)."""
    if mode not in ("auto", "never", "require"):
        raise ValueError(f"pyslurm mode {mode!r} is not auto, never or require")
    if mode == "never":
        return CLISource(cli)
    reason = pyslurm_unusable_reason(cli)
    if reason is None:
        try:
            src = PyslurmSource()
            log.info("reading Slurm through pyslurm")
            return src
        except Exception as exc:  # noqa: BLE001
            reason = f"import pyslurm failed: {exc.__class__.__name__}: {exc}"
    if mode == "require":
        raise SlurmError(f"pyslurm is required but unusable: {reason}")
    log.info("pyslurm not used (%s); reading Slurm through sinfo/squeue --json", reason)
    return CLISource(cli)


@dataclass
class Observation:
    """Slurm's state at ``time_ns`` (taken before the first query, so an event that happened
    while Slurm was being asked is never older than the observation) and the idle rule's view."""

    time_ns: int
    view: IdleView
    source: str
    #: node -> (GPUs, features) of every node of ``node_partitions`` with a valid name (what
    #: ``SyncNodes.kinds`` carries; docs/architecture.md, "Node kinds")
    kinds: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)


def observe(source: Source, rule: OwnJobRule, node_partitions: Iterable[str] = (),
            ignore_job_ids: Iterable[str] = ()) -> Observation:
    """Query Slurm once and apply the idle rule; raises SlurmError on any failure."""
    t_ns = time.time_ns()
    sinfo_doc, squeue_doc = source.fetch()
    nodes = parse_nodes(sinfo_doc)
    jobs = parse_jobs(squeue_doc)
    view = idle_nodes(nodes, jobs, rule, node_partitions=node_partitions,
                      ignore_job_ids=ignore_job_ids)
    parts = set(node_partitions)
    kinds = {name: (info.gpus, tuple(sorted(set(info.features))))
             for name, info in nodes.items()
             if is_node_name(name) and (not parts or not info.partitions
                                        or parts & set(info.partitions))}
    return Observation(t_ns, view, source.name, kinds)
