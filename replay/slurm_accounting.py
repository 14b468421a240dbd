"""Readers of a site's Slurm accounting for ``offcut replay slurm`` (:mod:`offcut.replay.slurm_log`
builds the node log from what they return): when each job held which nodes, and when which
nodes were down or drained.

* Jobs, two forms of ``sacct`` (told apart by content: JSON starts with ``{``):

  - text: ``sacct -X -a --parsable2 --noheader --format=`` :data:`SACCT_LOG_FIELDS` with
    ``SLURM_TIME_FORMAT=%s`` (:func:`sacct_command`); ``Start``/``End`` ``Unknown`` when the
    job never started / still runs, ``NodeList`` ``None assigned`` when it never ran.
  - JSON: ``sacct -a --json`` (:func:`sacct_json_command`). 22.05 (openapi ``dbv0.0.38``,
    captured on the test cluster: tests/fixtures/slurm_accounting) gives
    ``{"jobs": [{"job_id", "partition", "nodes": "n[1-2]", "state": {"current": "COMPLETED"},
    "time": {"start": 1795763775, "end": 1795763779, ...}, "steps": [...]}], "errors": []}``;
    23.02 to 24.05 (data_parser v0.0.39 to v0.0.41, ``src/plugins/data_parser/*/parsers.c``)
    keep the job's ``time/start``/``time/end`` plain and make ``state/current`` a list, the
    steps' times and most other numbers ``{"set", "infinite", "number"}`` objects; either
    spelling is read for the times (:func:`offcut.slurm_values.slurm_number`). A running
    job has ``end`` 0; a job that never ran ``nodes`` ``"None assigned"`` (22.05 gives a job
    cancelled while pending ``start`` = ``end`` = its cancel time) or ``start`` 0. Steps are
    ignored: the job's allocation holds its nodes from its start to its end (as ``-X`` does
    for the text).

* Node events: ``sacctmgr --parsable2 --noheader show event Event=Node`` with
  ``Format=`` :data:`EVENT_FIELDS` and ``SLURM_TIME_FORMAT=%s`` (:func:`sacctmgr_events_command`;
  22.05 spells the columns ``TimeStart``/``TimeEnd`` in its header, ``Unknown`` for an event
  still open). slurmctld records a node event only while a node is down, drained or failed
  (``clusteracct_storage_g_node_down`` / ``_node_up`` in ``src/slurmctld/node_mgr.c``), so
  every node event makes its nodes unavailable; cluster events (no ``NodeName``) are skipped.
  ``Reason`` is left out of the format: it is free text that may hold the ``|`` separator.
  ``sacctmgr`` has no ``--json`` in 22.05 to 24.05.

Every reader raises :class:`ReplayInputError` naming the line (text), the record index and job
id (JSON), or the parse position (broken or truncated JSON).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping

import pandas as pd

from offcut.parsable import NO_NODES, NO_VALUE, parsable_rows
from offcut.replay.bftrainer_data import ReplayInputError
from offcut.slurm_values import (MAX_INPUT_NODES, NodeBudget, NodeListError, expand_nodelist,
                                 reported_errors, slurm_number, slurm_time_arg)

__all__ = ["SACCT_LOG_FIELDS", "EVENT_FIELDS", "sacct_command", "sacct_json_command",
           "sacctmgr_events_command", "busy_intervals", "unavailable_intervals",
           "MAX_EXPANDED_NODES"]

#: the columns of the text accounting this module reads, in this order
SACCT_LOG_FIELDS = ("JobID", "JobName", "Partition", "State", "NodeList", "Start", "End")
#: the columns of ``sacctmgr show event`` this module reads, in this order
EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State")

#: ``(start_s, end_s, nodes)``: nodes held [epoch s, epoch s)
Interval = tuple[float, float, list[str]]


def _arg(ts: pd.Timestamp) -> str:
    """A UTC-naive Timestamp as Slurm's commands read times: the host's local time."""
    return slurm_time_arg(ts.value / 1e9)


def sacct_command(start: pd.Timestamp, end: pd.Timestamp) -> list[str]:
    """The ``sacct`` command (run with ``SLURM_TIME_FORMAT=%s``) of the text form: every
    user's allocations that ran between ``start`` and ``end`` (UTC-naive Timestamps; written in the host's local time, as Slurm reads them)."""
    return ["sacct", "-X", "-a", "--parsable2", "--noheader",
            f"--format={','.join(SACCT_LOG_FIELDS)}", f"--starttime={_arg(start)}",
            f"--endtime={_arg(end)}"]


def sacct_json_command(start: pd.Timestamp, end: pd.Timestamp) -> list[str]:
    """The ``sacct --json`` command of the JSON form for the window ``start``..``end``
    (UTC-naive Timestamps). Its times are epoch seconds anyway; run it *without*
    ``SLURM_TIME_FORMAT``: 22.05 answers ``"Unable to parse time format"`` in ``errors`` (exit
    status 0, no ``jobs``) under ``SLURM_TIME_FORMAT=%s`` (seen on the test cluster)."""
    return ["sacct", "-a", "--json", f"--starttime={_arg(start)}", f"--endtime={_arg(end)}"]


def sacctmgr_events_command(start: pd.Timestamp, end: pd.Timestamp) -> list[str]:
    """The ``sacctmgr`` command (run with ``SLURM_TIME_FORMAT=%s``) listing the node events
    (down, drained, failed) that overlap ``start``..``end`` (UTC-naive Timestamps)."""
    return ["sacctmgr", "--parsable2", "--noheader", "show", "event", "Event=Node",
            f"Start={_arg(start)}", f"End={_arg(end)}",
            f"Format={','.join(EVENT_FIELDS)}"]


#: most node names all records of one accounting file may expand to (a site's window of jobs
#: names far fewer): the shared size guard (:data:`offcut.slurm_values.MAX_INPUT_NODES`,
#: :class:`~offcut.slurm_values.NodeBudget`), counted over every record *before* any hostlist
#: is expanded, so a small hostile file is refused at once (each hostlist is bounded too)
MAX_EXPANDED_NODES = MAX_INPUT_NODES
#: deepest nesting of the JSON accounting (sacct --json nests 5-6 levels)
MAX_JSON_DEPTH = 64
#: longest number of the JSON accounting [characters] (Slurm writes 64-bit integers and
#: doubles: 24 at most)
MAX_JSON_NUMBER_CHARS = 40

#: a record to expand: ``(where, start_s, end_s or None, hostlist)``
_Record = tuple[str, float, "float | None", str]


def _held(records: Callable[[], Iterator[_Record]], end_s: float,
          keep: Collection[str] | None) -> list[Interval]:
    """The intervals of ``records`` (called twice: a first pass counts every hostlist's names
    against the size guard, the second expands them), each with only the names in ``keep``
    (None: all), as the very string objects of ``keep`` when it is a mapping or set-like of
    names, so a long window holds one reference per wanted node and record, not a copy of
    every name. Raises ReplayInputError naming the record that passes
    :data:`MAX_EXPANDED_NODES`, or a malformed or too large hostlist."""
    budget = NodeBudget(MAX_EXPANDED_NODES)
    for where, _t0, _t1, nodes in records():
        try:
            budget.charge(nodes)
        except NodeListError as exc:
            raise ReplayInputError(f"{where}: {exc}") from None
    canon = None if keep is None else {n: n for n in keep}
    out: list[Interval] = []
    for where, t0, t1, nodes in records():
        try:
            names = expand_nodelist(nodes)
        except NodeListError as exc:
            raise ReplayInputError(f"{where}: {exc}") from None
        t1 = end_s if t1 is None else t1
        if t1 <= t0:
            continue
        if canon is not None:
            names = [canon[n] for n in names if n in canon]
            if not names:
                continue
        out.append((t0, t1, names))
    return out


def _text_records(text: str, fields: tuple[str, ...], source: str
                  ) -> Iterator[tuple[int, list[str]]]:
    try:
        yield from parsable_rows(text, fields, source)
    except ValueError as exc:
        raise ReplayInputError(str(exc)) from None


#: latest time read [epoch s]: 9999-12-31T23:59:59 UTC, the last one a Timestamp spells
MAX_EPOCH_S = 253_402_300_799


def _epoch(value: str, what: str, where: str, hint: str) -> float | None:
    """A text time: epoch seconds (0 to :data:`MAX_EPOCH_S`), None when unknown."""
    if value.strip() in NO_VALUE:
        return None
    try:
        t = float(value)
    except ValueError:
        t = math.nan
    if not 0 <= t <= MAX_EPOCH_S:
        raise ReplayInputError(f"{where}: {what} {value[:40]!r} is not epoch seconds "
                               f"({hint})") from None
    return t


def _sacct_text(text: str, source: str) -> Iterator[tuple[str, str, str, float | None,
                                                            float | None]]:
    for number, cols in _text_records(text, SACCT_LOG_FIELDS, source):
        _, _, partition, _, nodes, start, end = cols
        where = f"{source} line {number}"
        hint = "times need SLURM_TIME_FORMAT=%s"
        yield (where, partition, nodes, _epoch(start, "start", where, hint),
               _epoch(end, "end", where, hint))


def _sacct_json(text: str, source: str) -> Callable[[], Iterator[tuple[str, str, str,
                                                                       float | None,
                                                                       float | None]]]:
    """The records of the JSON accounting ``text``: a function that iterates over them (the
    text is decoded and checked once, here)."""
    doc = _load_json(text, source)
    errors = reported_errors(doc) if isinstance(doc, Mapping) else ""
    if errors:
        hint = ("; run sacct --json without SLURM_TIME_FORMAT (22.05 fails so under it)"
                if "time format" in json.dumps(doc.get("errors")).lower() else "")
        raise ReplayInputError(f"{source}: sacct reported errors: {errors}{hint}")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("jobs"), list):
        raise ReplayInputError(f"{source}: not sacct --json output (an object with a \"jobs\" "
                               "list)")
    return lambda: _sacct_json_records(doc["jobs"], source)


def _sacct_json_records(jobs: list, source: str) -> Iterator[tuple[str, str, str, float | None,
                                                                   float | None]]:
    for index, job in enumerate(jobs):
        where = f"{source} record {index}"
        if not isinstance(job, Mapping):
            raise ReplayInputError(f"{where}: a job record is an object, not "
                                   f"{type(job).__name__}")
        if "job_id" in job:
            where += f" (job {str(job['job_id'])[:40]})"
        partition, nodes, times = job.get("partition"), job.get("nodes"), job.get("time")
        if not isinstance(partition, (str, type(None))) or not isinstance(nodes, (str, type(None))):
            raise ReplayInputError(f"{where}: \"partition\" and \"nodes\" are strings, not "
                                   f"{partition!r:.40} and {nodes!r:.40}")
        if not isinstance(times, Mapping) or "start" not in times or "end" not in times:
            raise ReplayInputError(f"{where}: no \"time\" object with \"start\" and \"end\"")
        t0, t1 = (_json_time(times[k], k, where) for k in ("start", "end"))
        yield where, partition or "", nodes or "", t0, t1


class _JsonLimit(ValueError):
    """A JSON number past :data:`MAX_JSON_NUMBER_CHARS` (raised by the decoder's hooks)."""


def _json_int(digits: str) -> int:
    if len(digits) > MAX_JSON_NUMBER_CHARS:
        raise _JsonLimit(digits)
    return int(digits)


def _json_float(digits: str) -> float:
    if len(digits) > MAX_JSON_NUMBER_CHARS:
        raise _JsonLimit(digits)
    return float(digits)


_DECODER = json.JSONDecoder(parse_int=_json_int, parse_float=_json_float)


def _load_json(text: str, source: str) -> Any:
    """The JSON document ``text``; ReplayInputError naming ``source`` and the place (line,
    column, record) for broken or truncated JSON, nesting deeper than
    :data:`MAX_JSON_DEPTH` or a number longer than :data:`MAX_JSON_NUMBER_CHARS`
    (both found by :func:`_json_limits` before the decoder runs)."""
    limit = _json_limits(text)
    if limit:
        raise ReplayInputError(f"{source}: {limit}")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        where = (f"{source}: not readable JSON at line {exc.lineno} column {exc.colno} "
                 f"(character {exc.pos} of {len(text)}): {exc.msg}")
        if not text.rstrip().endswith("}") or exc.pos >= len(text.rstrip()):
            where += f"; the file looks truncated: it breaks off in {_broken_record(text)}"
        raise ReplayInputError(where) from None
    except (RecursionError, ValueError, OverflowError, MemoryError) as exc:
        # not expected past _json_limits; one line all the same
        raise ReplayInputError(f"{source}: not readable JSON: {type(exc).__name__}") from None


_SCAN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|-?[0-9][0-9.eE+-]*')


def _json_limits(text: str) -> str:
    """Why the JSON ``text`` is past a limit (nesting deeper than :data:`MAX_JSON_DEPTH`, a
    number longer than :data:`MAX_JSON_NUMBER_CHARS`), naming the line, column and the
    ``jobs`` record it is in; "" when it is within them. One pass of a regular expression
    over the text (strings skipped whole), before any decoding."""
    depth, record, key, in_jobs = 0, -1, None, False
    for m in _SCAN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == '"':
            if depth == 1:
                key = tok
            continue
        if c in "[{":
            depth += 1
            if depth == 2:
                in_jobs = key == '"jobs"' and c == "["
            elif depth == 3 and in_jobs and c == "{":
                record += 1
            if depth > MAX_JSON_DEPTH:
                return f"{_place(text, m.start(), in_jobs, record)}: JSON nested deeper than " \
                       f"{MAX_JSON_DEPTH} levels"
        elif c in "]}":
            depth -= 1
        elif len(tok) > MAX_JSON_NUMBER_CHARS:
            return (f"{_place(text, m.start(), in_jobs and depth >= 3, record)}: a number of "
                    f"{len(tok)} characters (at most {MAX_JSON_NUMBER_CHARS}): {tok[:20]}...")
    return ""


def _place(text: str, pos: int, in_record: bool, record: int) -> str:
    """``record N, line L column C`` (the record only inside one) of character ``pos``."""
    line = text.count("\n", 0, pos) + 1
    col = pos - text.rfind("\n", 0, pos)
    return (f"record {record}, " if in_record and record >= 0 else "") + \
        f"line {line} column {col}"


_BETWEEN = re.compile(r"\s*,?\s*")
_JOB_ID = re.compile(r'"job_id"\s*:\s*(\d+)')


def _broken_record(text: str) -> str:
    """``record N`` (and ``(job J)`` when its id is there) of the first job record of the
    ``"jobs"`` list of broken JSON ``text`` that is not whole."""
    i = text.find('"jobs"')
    i = text.find("[", i) + 1 if i >= 0 else 0
    decoder, n = _DECODER, 0
    while i > 0:
        i = _BETWEEN.match(text, i).end()
        try:
            _, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError, OverflowError):  # JSONDecodeError or a limit
            break
        n += 1
    job = _top_level_job_id(text, i) if i > 0 else None
    return f"record {n}" + (f" (job {job})" if job else "")


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]')


def _top_level_job_id(text: str, i: int) -> str | None:
    """The ``job_id`` of the (maybe cut) record that starts at ``i``, not one of its parts'
    (``array``, ``het`` have a ``job_id`` too)."""
    depth = 0
    for tok in _TOKEN.finditer(text, i):
        t = tok.group()
        if t in "{[":
            depth += 1
        elif t in "}]":
            depth -= 1
            if depth <= 0:
                return None
        elif depth == 1 and t == '"job_id"':
            m = _JOB_ID.match(text, tok.start())
            return m.group(1) if m else None
    return None


def _json_time(value: Any, what: str, where: str) -> float | None:
    """A JSON time: epoch seconds, None when 0, unset or infinite (never started / still
    running)."""
    t = slurm_number(value, f"{where}: time/{what}", ReplayInputError)
    if t != t or t < 0 or MAX_EPOCH_S < t < math.inf:  # NaN, negative, past year 9999
        raise ReplayInputError(f"{where}: time/{what} {value!r:.60} is not a time")
    return None if t == 0 or t == float("inf") else t


def busy_intervals(text: str, *, end_s: float, source: str = "sacct",
                   own_partitions: Iterable[str] = ("scavenger",),
                   keep: Collection[str] | None = None) -> list[Interval]:
    """``(start_s, end_s, nodes)`` [epoch s] of every job of the accounting ``text`` (text or
    JSON form, module docstring) that started, outside ``own_partitions``; a job still
    running ends at ``end_s``. ``keep``: only these node names are kept in ``nodes`` (and
    jobs on none of them are left out); None: all.

    Raises:
        ReplayInputError: a malformed record, naming its line (text) or its index and job id
            (JSON), or the parse position of broken JSON (also JSON nested deeper than
            :data:`MAX_JSON_DEPTH` or a number longer than :data:`MAX_JSON_NUMBER_CHARS`);
            records naming more than :data:`MAX_EXPANDED_NODES` nodes in all, counted
            before any is expanded.
    """
    own = set(own_partitions)
    if text.lstrip().startswith("{"):
        rows = _sacct_json(text, source)
    else:
        def rows():
            return _sacct_text(text, source)

    def records() -> Iterator[_Record]:
        for where, partition, nodes, t0, t1 in rows():
            if own & set(partition.split(",")) or t0 is None or nodes.strip() in NO_NODES:
                continue
            yield where, t0, t1, nodes

    return _held(records, end_s, keep)


def unavailable_intervals(text: str, *, end_s: float, source: str = "events",
                          keep: Collection[str] | None = None) -> list[Interval]:
    """``(start_s, end_s, nodes)`` [epoch s] of every node event (down, drained, failed) of
    ``sacctmgr show event`` text (:data:`EVENT_FIELDS`, module docstring); an event still open
    ends at ``end_s``; cluster events (no node) are skipped. ``keep`` as for
    :func:`busy_intervals`.

    Raises:
        ReplayInputError: a malformed line (its number): other columns, a time that is not
            epoch seconds, an unreadable hostlist; more than :data:`MAX_EXPANDED_NODES`
            node names in all, counted before any is expanded.
    """
    hint = "times need SLURM_TIME_FORMAT=%s"

    def records() -> Iterator[_Record]:
        for number, cols in _text_records(text, EVENT_FIELDS, source):
            nodes, start, end, _ = cols
            where = f"{source} line {number}"
            t0 = _epoch(start, "TimeStart", where, hint)
            t1 = _epoch(end, "TimeEnd", where, hint)
            if not nodes.strip():
                continue
            if t0 is None:
                raise ReplayInputError(f"{where}: a node event without TimeStart")
            yield where, t0, t1, nodes

    return _held(records, end_s, keep)
