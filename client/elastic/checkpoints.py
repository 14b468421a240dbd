"""The checkpoints of an elastic task (docs/execution.md): the complete ones in a directory
(:func:`checkpoint_files`, :func:`latest_checkpoint`), their atomic writes keeping the last
few (:func:`write_checkpoint`), and :class:`RunCheckpoints`, one rank's view of them during a
generation (the latest one chosen by rank 0, the figure of the latest one loaded or written,
when the last one was). Part of :mod:`offcut.client.elastic`, which re-exports the public
names; ``torch`` is imported only to read and write a checkpoint.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

log = logging.getLogger("offcut.client.elastic")

#: name of a complete checkpoint: ``ckpt-<samples_done>.pt``
CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.pt")

StateArg = Mapping[str, Any] | Callable[[], Mapping[str, Any]]


def checkpoint_files(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints in ``directory``: ``(samples_done, path)`` sorted by samples,
    oldest first. Temporary files of writers (``.ckpt-*.tmp``) and other names are ignored;
    a missing directory has none."""
    d = Path(directory)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = CHECKPOINT_RE.fullmatch(name)
        if m:
            found.append((int(m.group(1)), d / name))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> tuple[int, Path] | None:
    """The complete checkpoint with the most samples, ``(samples_done, path)``, or None."""
    files = checkpoint_files(directory)
    return files[-1] if files else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(directory: str | os.PathLike, samples_done: int, payload: Any, *,
                     keep: int = 2) -> Path:
    """Write ``payload`` (anything ``torch.save`` takes) as ``ckpt-<samples_done>.pt``
    atomically: a temporary file in the same directory, ``fsync``, ``os.replace``, ``fsync``
    of the directory. Then remove all but the ``keep`` complete checkpoints with the most
    samples. Creates the directory. Returns the path.

    Raises ``ValueError`` for ``samples_done`` < 0 or ``keep`` < 1, and ``OSError`` /
    torch's errors for a failed write (the temporary file is removed; older checkpoints are
    untouched).
    """
    import torch

    samples_done = int(samples_done)
    if samples_done < 0:
        raise ValueError(f"samples_done must be >= 0, got {samples_done}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"ckpt-{samples_done}.pt"
    fd, tmp = tempfile.mkstemp(prefix=f".ckpt-{samples_done}.", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(d)
    old = checkpoint_files(d)[:-keep]
    for _, path in old:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    if old:
        _fsync_dir(d)
    return final



class RunCheckpoints:
    """One rank's view of its task's checkpoints during a generation: rank 0 chooses the
    latest complete one and writes new ones (:func:`write_checkpoint`); every rank loads the
    one rank 0 chose and keeps the figure of the latest one it loaded or wrote.

    Args:
        directory: the task's checkpoint directory (``OFFCUT_CHECKPOINT_DIR``), on storage
            every node sees.
        rank: this process's rank in the generation (0 chooses, writes and is the clock of
            time-based checkpoints).

    Attributes:
        samples_done: cumulative samples [samples] of the latest checkpoint loaded or written
            (0 before any).
        has_checkpoint: whether this run loaded or wrote one.
        last_t: ``time.monotonic()`` [s] of the latest checkpoint (or of :meth:`mark`).
    """

    def __init__(self, directory: Path, rank: int):
        self.directory = directory
        self.rank = rank
        self.samples_done = 0
        self.has_checkpoint = False
        self.last_t = time.monotonic()

    def mark(self) -> None:
        """Restart the clock of time-based checkpoints (:meth:`due`) now."""
        self.last_t = time.monotonic()

    def due(self, every_s: float | None) -> bool:
        """On rank 0: whether ``every_s`` seconds [s] have passed since the latest checkpoint
        (False for None and on the other ranks)."""
        return (self.rank == 0 and every_s is not None
                and time.monotonic() - self.last_t >= every_s)

    def latest_samples(self) -> int:
        """On rank 0 the samples [samples] of the latest complete checkpoint
        (:func:`latest_checkpoint`); -1 when there is none, and on the other ranks."""
        found = latest_checkpoint(self.directory) if self.rank == 0 else None
        return -1 if found is None else found[0]

    def load(self, samples: int, map_location: Any, weights_only: bool) -> dict | None:
        """Load ``ckpt-<samples>.pt`` (the checkpoint rank 0 chose; none for ``samples`` < 0)
        with ``torch.load(map_location=, weights_only=)`` by name (on NFS an open
        revalidates, a directory listing may be stale); sets :attr:`samples_done`. Returns its
        dict (``state``, ``samples_done``, ``generation``, ``world_size``) or None.

        Raises ``RuntimeError`` when the file is missing here (the directory is not on storage
        every node sees) or is not such a checkpoint, and ``torch.load``'s errors.
        """
        if samples < 0:
            log.info("rank %d: no checkpoint in %s: starting from 0 samples", self.rank,
                     self.directory)
            return None
        import torch

        path = self.directory / f"ckpt-{samples}.pt"
        try:
            ckpt = torch.load(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError:
            raise RuntimeError(f"rank {self.rank}: {path}, rank 0's latest checkpoint, is not "
                               f"here: OFFCUT_CHECKPOINT_DIR must be on storage every node "
                               f"sees") from None
        if not isinstance(ckpt, dict) or "state" not in ckpt or "samples_done" not in ckpt:
            raise RuntimeError(f"{path} is not an offcut.client.elastic checkpoint (a dict "
                               f"with 'state' and 'samples_done')")
        self.samples_done = int(ckpt["samples_done"])
        self.has_checkpoint = True
        log.info("rank %d: resumed from %s (%d samples, written by generation %s on %s "
                 "ranks)", self.rank, path.name, self.samples_done, ckpt.get("generation"),
                 ckpt.get("world_size"))
        return ckpt

    def save(self, state: StateArg, samples_done: int, *, generation: int, world_size: int,
             keep: int) -> tuple[Path | None, bool]:
        """Record a checkpoint at ``samples_done`` cumulative samples [samples]: rank 0 writes
        ``{"state": state, "samples_done", "generation", "world_size"}`` (``state`` a mapping
        or a callable returning one, called here) with :func:`write_checkpoint` (``keep``
        kept) unless it holds no new samples; the other ranks only note the figure.

        Returns ``(path, written)``: the checkpoint's path on rank 0 (None elsewhere) and
        whether this call wrote it.

        Raises ``ValueError`` when ``samples_done`` is negative or below the latest
        checkpoint's (this run's, or on rank 0 the latest on disk), and the write's errors.
        """
        samples_done = int(samples_done)
        if samples_done < 0:
            raise ValueError(f"samples_done must be >= 0, got {samples_done}")
        if self.has_checkpoint and samples_done < self.samples_done:
            raise ValueError(f"samples_done went down from {self.samples_done} (the latest "
                             f"checkpoint's) to {samples_done}")
        unchanged = self.has_checkpoint and samples_done == self.samples_done
        d = self.directory
        if self.rank != 0:
            self.samples_done, self.has_checkpoint = samples_done, True
            self.mark()
            return None, False
        if unchanged:
            self.mark()
            return d / f"ckpt-{samples_done}.pt", False
        latest = latest_checkpoint(d)
        if latest is not None and latest[0] > samples_done:
            raise ValueError(f"{latest[1]} holds more samples ({latest[0]}) than this "
                             f"checkpoint ({samples_done}): call load_checkpoint() first, or "
                             f"use an empty OFFCUT_CHECKPOINT_DIR")
        payload = {"state": state() if callable(state) else state,
                   "samples_done": samples_done, "generation": generation,
                   "world_size": world_size}
        t0 = time.monotonic()
        path = write_checkpoint(d, samples_done, payload, keep=keep)
        self.samples_done, self.has_checkpoint = samples_done, True
        self.mark()
        log.info("checkpoint %s: %d samples, generation %d, world size %d (%.2f s)",
                 path.name, samples_done, generation, world_size, time.monotonic() - t0)
        return path, True
