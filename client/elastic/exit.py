"""How an elastic process ends (docs/execution.md): the protocol's exit codes, which errors
mean a lost peer (:func:`is_peer_loss`), and the exit itself (:func:`end_process`). Part of
:mod:`offcut.client.elastic`, which re-exports the public names.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
from typing import Any, Callable, NoReturn

log = logging.getLogger("offcut.client.elastic")

#: exit code of a run whose task's work is done (the task is COMPLETED)
EXIT_DONE = 0
#: exit code of a run that checkpointed (or had nothing to save, or lost a peer): restart me
EXIT_RESTART = 75  # EX_TEMPFAIL

#: phrases of the errors torch.distributed backends raise when a peer vanished or hangs
_PEER_LOSS_RE = re.compile(
    r"connection (?:closed|reset|refused|aborted)|(?:closed|reset) by peer|broken pipe"
    r"|timed out|socket timeout|ECONNRESET|EPIPE|gloo/transport|communicator was aborted"
    r"|remote process exited|network error", re.IGNORECASE)


def is_peer_loss(exc: BaseException) -> bool:
    """True when ``exc`` looks like a collective that failed because a peer vanished or
    stopped answering: a ``torch.distributed.DistError`` (``DistBackendError``,
    ``DistNetworkError``, ``DistStoreError``), or a ``RuntimeError`` / ``OSError`` whose
    message is a transport error (gloo's "Connection closed by peer", "Connection reset by
    peer", "Timed out waiting ... for recv operation", a broken pipe, an aborted NCCL
    communicator). Looks through ``__cause__`` / ``__context__``."""
    dist_error = None
    if "torch" in sys.modules:
        try:
            from torch.distributed import DistError as dist_error
        except ImportError:  # torch built without distributed
            dist_error = None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if dist_error is not None and isinstance(exc, dist_error):
            return True
        if isinstance(exc, (RuntimeError, OSError)) and _PEER_LOSS_RE.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False



def flush_std_streams() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``, ignoring closed or missing streams."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def end_process(code: int, hard_exit: bool) -> NoReturn:
    """End the process with exit status ``code``. ``hard_exit``: flush stdout/stderr, run the
    ``atexit`` handlers (logging's flush among them), then ``os._exit(code)``, skipping the
    interpreter's teardown (where torch.distributed's C++ objects can abort or hang the
    process); otherwise flush and raise ``SystemExit(code)``."""
    flush_std_streams()
    if not hard_exit:
        raise SystemExit(code)
    try:
        atexit._run_exitfuncs()  # what a normal exit runs first (logging.shutdown ...)
    finally:
        flush_std_streams()
        os._exit(code)


def call_restart_hook(hook: Callable[[], Any] | None, rank: int) -> None:
    """Call ``hook`` (an ``on_restart`` callback, before an exit 75) when there is one; log
    (never raise) its exception, naming ``rank``: the exit stays 75."""
    if hook is None:
        return
    try:
        hook()
    except Exception as exc:  # the exit stays 75: the next generation copes
        log.warning("rank %d: on_restart failed: %s: %s", rank, type(exc).__name__, exc)


def log_peer_loss(exc: BaseException, rank: int, generation: int) -> None:
    """Log that a peer of ``generation`` vanished (``exc``, a peer loss: :func:`is_peer_loss`)
    and that ``rank`` exits :data:`EXIT_RESTART`."""
    log.warning("rank %d: a peer of generation %d vanished (%s: %s); exiting %d",
                rank, generation, type(exc).__name__,
                str(exc).splitlines()[0][:300] if str(exc) else "", EXIT_RESTART)
