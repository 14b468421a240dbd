"""The asyncio event loop that serves gRPC, on a thread of its own (docs/architecture.md,
"Threads").

The daemon's gRPC server is ``grpc.aio``'s: its I/O, its interceptors and every open stream
live on one event loop, where a waiting stream costs a coroutine, not a thread. The daemon's
own API stays synchronous (``OffcutServer.start``/``stop``/``wait`` are called from
``offcutd``'s main thread, from tests and from benchmarks), so the loop runs on a daemon thread
and the synchronous side hands it coroutines with :meth:`EventLoopThread.run`.

One loop serves every ``OffcutServer`` of a process (:func:`shared_loop`): gRPC's asyncio
stack anchors itself to the loop that first uses it, so the loop lives as long as the process.
Its default executor (``offcut-stream`` threads, :data:`STREAM_WORKERS`) takes the few blocking
steps of streams (reading the journal for ``ExportHistory``, an ownership check when a watch
opens), apart from the workers of the unary calls (:mod:`offcut.daemon.edge.workers`).

The loop is uvloop's (libuv) where uvloop is installed (a dependency on Linux and macOS): every
call passes through the loop at least twice (in, and back from its worker thread), and uvloop
takes 10-15 % less of the daemon's CPU per unary call than asyncio's own loop
(docs/architecture.md, "Threads"); without it asyncio's loop serves, logged once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Coroutine, TypeVar

T = TypeVar("T")

#: threads of the loop's default executor: blocking steps of streams (never a thread per stream)
STREAM_WORKERS = 4

log = logging.getLogger("offcut.daemon")


def new_loop() -> tuple[asyncio.AbstractEventLoop, str]:
    """A new event loop and its kind: ``uvloop``, or ``asyncio`` where uvloop cannot be
    imported (said once in the log, with the cost)."""
    try:
        import uvloop
    except ImportError as exc:
        log.info("uvloop is not importable (%s): asyncio's loop serves gRPC (about 10-15 %% "
                 "more daemon CPU per call; pip install uvloop)", exc)
        return asyncio.new_event_loop(), "asyncio"
    return uvloop.new_event_loop(), "uvloop"


class EventLoopThread:
    """An asyncio event loop running forever on a daemon thread named ``name``.

    Args:
        name: the thread's name.
        stream_workers: threads of the loop's default executor (``offcut-stream``).
    """

    def __init__(self, name: str = "offcut-grpc-loop", stream_workers: int = STREAM_WORKERS):
        #: the loop, and which implementation it is (:func:`new_loop`)
        self.loop, self.kind = new_loop()
        self.loop.set_default_executor(
            ThreadPoolExecutor(max_workers=stream_workers, thread_name_prefix="offcut-stream"))
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=name,
                                        daemon=True)
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on the loop's thread."""
        return threading.get_ident() == self._thread.ident

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait up to ``timeout_s`` [s] (None: no limit) for its
        result; its exception is raised here.

        Raises:
            RuntimeError: called on the loop's own thread (it would wait for itself).
            TimeoutError: no result within ``timeout_s``.
        """
        if self.in_loop_thread():
            coro.close()  # never awaited
            raise RuntimeError("EventLoopThread.run() called on the event loop's own thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Call ``callback(*args)`` on the loop soon; from any thread."""
        self.loop.call_soon_threadsafe(callback, *args)


#: the loop of the node side's server (``node_listen``): Slurm's node events on a loop of their
#: own, never behind the calls on ``listen`` (docs/security.md, "Round two: junk credentials")
NODE_LOOP = "offcut-node-loop"

_shared: dict[str, EventLoopThread] = {}
_shared_lock = threading.Lock()


def shared_loop(name: str = "offcut-grpc-loop") -> EventLoopThread:
    """The process's gRPC event loop called ``name`` (started at the first call, lives as long
    as the process): the default serves ``listen``, :data:`NODE_LOOP` the node side."""
    with _shared_lock:
        if name not in _shared:
            _shared[name] = EventLoopThread(name)
        return _shared[name]
