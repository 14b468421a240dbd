"""A lost peer ends the generation in bounded time (docs/execution.md, "A lost peer"): a
heartbeat of every process on the generation's own store (the ``TCPStore`` of the
rendezvous, hosted by rank 0), so that a process whose peer vanished exits 75 within the
peer timeout even where no collective would notice (a local phase between steps) or where the
backend's own timeout would abort the process instead (NCCL's watchdog). Part of
:mod:`offcut.client.elastic`; ``torch`` is imported only when started.

Each process's thread adds 1 to ``offcut/hb/GEN/RANK`` every ``interval_s``. Rank 0's thread
also reads every rank's counter and, when one has not moved for ``timeout_s`` (by rank 0's
own monotonic clock: no sender's time is used) and that rank has not said it left
(``offcut/left/GEN/RANK``, set by a process that ends on its own), writes
``offcut/lost/GEN`` = that rank. The other ranks read rank 0's counter and that key: a peer is
lost when ``offcut/lost/GEN`` is set, or rank 0's counter (or the store itself) has not
answered for ``timeout_s``. Cost: rank 0 reads ``world_size`` keys per interval, every other
process 3 keys.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Callable

log = logging.getLogger("offcut.client.elastic")

#: the heartbeat's period as a share of the peer timeout (at most :data:`MAX_INTERVAL_S`)
INTERVAL_SHARE = 0.2
#: longest heartbeat period [s]
MAX_INTERVAL_S = 5.0


class PeerWatch:
    """The heartbeat thread of one process of a generation.

    Args:
        master_addr, master_port: the generation's store (rank 0's ``TCPStore``).
        rank, world_size, generation: this process and its generation.
        timeout_s: a peer silent this long [s] is lost (``OFFCUT_PEER_TIMEOUT_S``).
        on_lost: called once, from the watch's thread, with a description of the lost peer;
            it is expected to end the process (exit 75).
        interval_s: the heartbeat's period [s]; default ``min(INTERVAL_SHARE * timeout_s,
            MAX_INTERVAL_S)``.
        clock: monotonic clock [s] (injectable for tests).
    """

    def __init__(self, master_addr: str, master_port: int, *, rank: int, world_size: int,
                 generation: int, timeout_s: float, on_lost: Callable[[str], None],
                 interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.addr, self.port = master_addr, master_port
        self.rank, self.world_size, self.generation = rank, world_size, generation
        self.timeout_s = float(timeout_s)
        self.interval_s = interval_s or min(INTERVAL_SHARE * self.timeout_s, MAX_INTERVAL_S)
        self.on_lost = on_lost
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store = None
        prefix = f"offcut/hb/{generation}/"
        self._beat_key = prefix + str(rank)
        self._beat_keys = [prefix + str(r) for r in range(world_size)]
        self._left_keys = [f"offcut/left/{generation}/{r}" for r in range(world_size)]
        self._lost_key = f"offcut/lost/{generation}"

    def start(self) -> None:
        """Connect to the store (a client connection of its own) and start the thread."""
        if self.world_size < 2 or self._thread is not None:
            return
        import torch.distributed as dist

        self._store = dist.TCPStore(self.addr, self.port, self.world_size, is_master=False,
                                    timeout=timedelta(seconds=max(1.0, self.interval_s)),
                                    wait_for_workers=False)
        self._store.add(self._beat_key, 1)
        self._thread = threading.Thread(target=self._run, name="offcut-peer-watch", daemon=True)
        self._thread.start()

    def stop(self, left: bool = True) -> None:
        """Stop the thread (idempotent); ``left``: tell the peers this process ends on its own
        (so that they do not take it for lost)."""
        self._stop.set()
        if left and self._store is not None:
            try:
                self._store.set(self._left_keys[self.rank], "1")
            except Exception as exc:  # the store is gone: nobody is left to tell
                log.debug("peer watch: cannot mark rank %d as left: %s", self.rank, exc)
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2 * self.interval_s + 1)

    def _run(self) -> None:
        seen: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved)
        last_contact = self.clock()
        while not self._stop.wait(self.interval_s):
            now = self.clock()
            try:
                self._store.add(self._beat_key, 1)
                lost = self._check(seen, now)
                last_contact = now
            except Exception as exc:  # the store (rank 0's process or node) does not answer
                lost = None
                if now - last_contact > self.timeout_s:
                    lost = (f"the generation's store on rank 0 ({self.addr}:{self.port}) has "
                            f"not answered for {now - last_contact:.0f} s ({exc})")
            if lost and not self._stop.is_set():
                self._stop.set()
                self.on_lost(lost)
                return

    def _check(self, seen: dict[int, tuple[int, float]], now: float) -> str | None:
        store = self._store
        if self.rank != 0:
            if store.check([self._lost_key]):
                return f"rank 0 found rank {store.get(self._lost_key).decode()} silent"
            ranks = [0]
        else:
            ranks = range(1, self.world_size)
        for r in ranks:
            count = store.add(self._beat_keys[r], 0)
            before = seen.get(r)
            if before is None or count != before[0]:
                seen[r] = (count, now)
            elif now - before[1] > self.timeout_s and not store.check([self._left_keys[r]]):
                if self.rank == 0:
                    store.set(self._lost_key, str(r))
                return f"rank {r}'s heartbeat stopped {now - before[1]:.0f} s ago"
        return None
