"""Upgrades of state files written by earlier releases (docs/architecture.md §6).

Format 1 (releases up to 3593fb3) stored each journal row's reply as the serialized
``offcut.v1`` message (``Decision`` for node events, ``SubmitTaskResponse``,
``CancelTaskResponse``, ``ReportTaskRunResponse``, ``ReportProgressResponse``) and each Zeus
request's answer as its ``Prediction`` / ``ResumedTrial`` message. Format 2 stores the
application's JSON (:meth:`offcut.daemon.replies.Reply.to_record`,
:func:`offcut.daemon.zeus.registry.stored_answer`). This module sits at the gRPC edge: it is
the one place after start-up that still reads old wire messages, so the application never
does. Events, allocation answers and snapshots were already JSON and are unchanged.

Format 3 (docs/architecture.md §6, "Zeus rows") stores a Zeus job as rows: format 2 kept the whole
:meth:`offcut.daemon.zeus.bso.BatchSizeJob.to_dict` (every trial and observed run) in the job's
``zeus_state`` row, rewritten on every call; format 3 keeps there only the summary
(:meth:`~offcut.daemon.zeus.bso.BatchSizeJob.summary`, with ``trial_count``), one
``zeus_trials`` row per trial and one ``zeus_observations`` row per observed run, and stamps
stored Zeus answers with ``zeus_requests.created_at`` (the upgrade stamps the old ones with
the upgrade's time, so they get the whole retention window).

Format 4 (docs/architecture.md, "6. Durability") adds ``journal.sha256``, the checksum of each journal row
(:func:`offcut.daemon.store.journal_checksum`), written with the row. The upgrade only adds the
column: the rows already there keep NULL (written before checksums; loaded as before, only
checked to be JSON). Computing their sums now would vouch for rows nobody checked, and rewrite
a week of journal.
"""

from __future__ import annotations

import json
import sqlite3
import time

from offcut.daemon import protocol
from offcut.daemon.replies import Reply
from offcut.daemon.store import put_zeus_observations, put_zeus_trials
from offcut.daemon.zeus.bso import Prediction, Resumed
from offcut.daemon.zeus.registry import RESUME_KEY, stored_answer
from offcut.v1 import decision_pb2, tasks_pb2

#: rows converted per query (the journal is not read at once)
_CHUNK_ROWS = 500

#: format-1 reply message of each journal kind that answered about tasks
_V1_REPLY = {"submit": tasks_pb2.SubmitTaskResponse, "cancel": tasks_pb2.CancelTaskResponse,
             "run": tasks_pb2.ReportTaskRunResponse,
             "progress": tasks_pb2.ReportProgressResponse}


def reply_from_v1(kind: str, stored: bytes) -> Reply:
    """The :class:`Reply` of a format-1 journal row of ``kind``; ValueError for a kind that
    format 1 did not write."""
    if kind in ("nodes", "snapshot"):
        return Reply(decision=protocol.decision_from_pb(decision_pb2.Decision.FromString(stored)))
    message = _V1_REPLY.get(kind)
    if message is None:
        raise ValueError(f"journal row of unknown kind {kind!r}")
    reply = message.FromString(stored)
    tasks = list(reply.tasks) if kind == "progress" else [reply.task]
    return Reply(decision=protocol.decision_from_pb(reply.decision),
                 tasks=[protocol.task_from_pb(t) for t in tasks])


def zeus_answer_from_v1(request_key: str, stored: bytes) -> bytes:
    """The format-2 stored answer of a format-1 Zeus answer (``ResumeTrial:`` keys hold a
    ``ResumedTrial``, the others a ``Prediction``)."""
    from offcut.v1 import zeus_pb2

    if request_key.startswith(RESUME_KEY):
        r = zeus_pb2.ResumedTrial.FromString(stored)
        return stored_answer(Resumed(
            trial_number=r.trial_number, batch_size=r.batch_size, epochs=r.epochs,
            time_s=r.time_s, energy_j=r.energy_j, cost_j=r.cost_j, cost_bound_j=r.cost_bound_j,
            exploration=r.exploration, generation=r.generation, taken_over=r.taken_over))
    p = zeus_pb2.Prediction.FromString(stored)
    return stored_answer(Prediction(batch_size=p.batch_size, trial_number=p.trial_number,
                                    cost_bound_j=p.cost_bound_j, exploration=p.exploration))


def upgrade_1_to_2(db: sqlite3.Connection) -> None:
    """Rewrite every stored reply and Zeus answer of a format-1 file in format 2 (inside the
    caller's transaction)."""
    after = 0
    while True:
        rows = db.execute("SELECT id, kind, response FROM journal WHERE id > ? ORDER BY id "
                          "LIMIT ?", (after, _CHUNK_ROWS)).fetchall()
        if not rows:
            break
        db.executemany("UPDATE journal SET response = ? WHERE id = ?",
                       [(reply_from_v1(kind, bytes(raw)).to_record(), row_id)
                        for row_id, kind, raw in rows])
        after = rows[-1][0]
    answers = db.execute("SELECT request_id, response FROM zeus_requests").fetchall()
    db.executemany("UPDATE zeus_requests SET response = ? WHERE request_id = ?",
                   [(zeus_answer_from_v1(key, bytes(raw)), key) for key, raw in answers])


def split_zeus_job(stored: dict) -> tuple[dict, list[dict], list[tuple[int, float]]]:
    """A format-2 ``zeus_state`` document of a batch-size job as (format-3 document, trial
    records, observed runs ``(batch size, reward = -cost [J])`` in order)."""
    job = dict(stored["job"])
    trials = list(job.pop("trials"))
    observations = [(int(b), float(r)) for b, r in job.pop("observations")]
    job["trial_count"] = max((int(t["trial_number"]) for t in trials), default=0)
    return {**stored, "job": job}, trials, observations


def upgrade_2_to_3(db: sqlite3.Connection, now: float | None = None) -> None:
    """Split every Zeus job's document into its summary and rows (module docstring, format 3)
    and add ``zeus_requests.created_at`` = ``now`` [s, wall clock; default the current time]
    (inside the caller's transaction)."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(zeus_requests)")]
    if "created_at" not in columns:
        db.execute("ALTER TABLE zeus_requests ADD COLUMN created_at REAL NOT NULL DEFAULT 0")
    db.execute("UPDATE zeus_requests SET created_at = ?", (time.time() if now is None else now,))
    rows = db.execute("SELECT job_id, state FROM zeus_state WHERE kind = 'bso'").fetchall()
    for job_id, text in rows:
        summary, trials, observations = split_zeus_job(json.loads(text))
        db.execute("UPDATE zeus_state SET state = ? WHERE kind = 'bso' AND job_id = ?",
                   (json.dumps(summary, separators=(",", ":")), job_id))
        put_zeus_trials(db, job_id, trials)
        put_zeus_observations(db, job_id, [(seq, b, r) for seq, (b, r) in
                                           enumerate(observations)])


def upgrade_3_to_4(db: sqlite3.Connection) -> None:
    """Add ``journal.sha256`` (module docstring, format 4; NULL for the rows already there;
    inside the caller's transaction, no row rewritten)."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(journal)")]
    if "sha256" not in columns:
        db.execute("ALTER TABLE journal ADD COLUMN sha256 TEXT")


#: the upgrades offcutd applies when it opens an older state file (``Store(upgrades=...)``)
UPGRADES = {1: upgrade_1_to_2, 2: upgrade_2_to_3, 3: upgrade_3_to_4}
