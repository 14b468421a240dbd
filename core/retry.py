"""Retrying a call while the daemon restarts (gRPC ``UNAVAILABLE``): one backoff policy for
every client (the Python API and CLI through :class:`offcut.client.retry.RetryPolicy`, the
Slurm hooks and watcher through :class:`offcut.slurm_plugin.rpc.NodeEventSender`).

Backoff: the first retry waits ``initial_backoff_s`` (default 0.05 s), each later one
``multiplier`` (2) times longer, at most ``max_backoff_s`` (1 s), each wait scaled by a random
factor in ``[1 - jitter, 1 + jitter]`` (jitter 0.2). Overall deadline: no attempt starts
later than ``deadline_s`` (default 60 s) after the first one began; then the last error is
raised. Which calls may be repeated is the caller's to say (:meth:`Backoff.run`'s
``retryable``): only calls that cannot be applied twice.

Light on purpose (standard library only, no grpc import): a Slurm hook imports it.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

log = logging.getLogger("offcut.retry")

T = TypeVar("T")

__all__ = ["Backoff", "is_unavailable"]


@dataclass
class Backoff:
    """When to repeat a call that failed because the daemon is unavailable.

    Args:
        deadline_s: no attempt starts later than this after the first one began [s].
        initial_backoff_s: wait before the first retry [s].
        max_backoff_s: longest wait between attempts [s]; also gRPC's reconnect backoff cap.
        multiplier: each wait is this many times the previous one (>= 1).
        jitter: each wait is scaled by a uniform factor in ``[1 - jitter, 1 + jitter]``
            (0 <= jitter < 1).
        seed: seed of the jitter's random numbers (None: fresh entropy). Only timing depends
            on it, never what is sent.
        sleep, clock: injectable for tests (``time.sleep``, ``time.monotonic``; seconds).

    Attributes:
        retries: retries made so far through this policy (all calls).

    Raises:
        ValueError: a parameter out of its range.
    """

    deadline_s: float = 60.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0
    jitter: float = 0.2
    seed: int | None = None
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    retries: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.deadline_s >= 0:
            raise ValueError(f"deadline_s must be >= 0, got {self.deadline_s}")
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError("need 0 < initial_backoff_s <= max_backoff_s, got "
                             f"{self.initial_backoff_s}, {self.max_backoff_s}")
        if not self.multiplier >= 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        self._rng = random.Random(self.seed)

    def backoffs(self) -> Iterator[float]:
        """The waits [s] between attempts, in order (endless; jitter applied)."""
        wait = self.initial_backoff_s
        while True:
            yield wait * (1.0 + self.jitter * (2.0 * self._rng.random() - 1.0))
            wait = min(self.max_backoff_s, wait * self.multiplier)

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel arguments that make the channel reconnect to a restarted daemon
        within about ``max_backoff_s`` (gRPC's defaults back off up to 120 s)."""
        cap_ms = max(1, int(self.max_backoff_s * 1000))
        first_ms = min(cap_ms, max(1, int(self.initial_backoff_s * 1000)))
        return [("grpc.initial_reconnect_backoff_ms", first_ms),
                ("grpc.min_reconnect_backoff_ms", first_ms),
                ("grpc.max_reconnect_backoff_ms", cap_ms)]

    def run(self, attempt: Callable[[float | None], T], retryable: Callable[[BaseException], bool],
            name: str, deadline_s: float | None = None,
            logger: logging.Logger | None = None) -> T:
        """``attempt(time_left)`` until it returns, repeating it after an exception for which
        ``retryable(exc)`` is true (the daemon unavailable, and the call safe to repeat) with
        this policy's waits; any other exception, or a retryable one once the deadline
        (the policy's ``deadline_s``) leaves no time for the next wait, is raised unchanged.

        A caller's own budget ``deadline_s`` [s] (a hook's time limit; the smaller of the two
        counts) is used to its end: ``time_left`` is the time left of it for each attempt
        (None without one), and when the next wait no longer fits, one last attempt is made
        at once with the time left. ``name`` names the call in the log lines (of ``logger``,
        default ``offcut.retry``)."""
        out = logger or log
        limit = self.deadline_s if deadline_s is None else min(deadline_s, self.deadline_s)
        started = self.clock()
        waits = self.backoffs()
        tries = 0
        last = False  # the budget's last attempt was made
        while True:
            tries += 1
            left = None if deadline_s is None else max(limit - (self.clock() - started), 0.0)
            try:
                return attempt(left)
            except Exception as exc:
                if not retryable(exc):
                    raise
                wait = next(waits)
                spent = self.clock() - started
                if spent + wait > limit and deadline_s is not None and not last \
                        and limit - spent > 0.01:
                    wait, last = 0.0, True  # the caller's budget: its rest for one attempt
                elif spent + wait > limit:
                    out.warning("%s: offcutd still unavailable after %d attempt(s) in %.1f s",
                                name, tries, self.clock() - started)
                    raise
                out.info("%s: offcutd unavailable (%s); retry %d in %.2f s", name,
                         _details(exc), tries, wait)
                self.retries += 1
                self.sleep(wait)


def is_unavailable(err: BaseException) -> bool:
    """Whether ``err`` is gRPC's UNAVAILABLE (the daemon down or restarting): the error every
    client of offcutd retries (:meth:`Backoff.run`'s ``retryable``). grpc is imported here,
    not at module import, so the backoff stays usable without it."""
    import grpc

    return (isinstance(err, grpc.RpcError) and callable(getattr(err, "code", None))
            and err.code() == grpc.StatusCode.UNAVAILABLE)


def _details(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            return str(details())
        except Exception:  # noqa: BLE001 - only for a log line
            pass
    return str(exc)
