"""The daemon's heap under large requests (docs/security.md, "Round two: what one user makes
the daemon keep").

A request may carry up to ``max_command_bytes`` (1 MiB) of command. glibc's ``malloc`` serves
such a block with ``mmap`` (returned to the system at ``free``) only while it is above the
*dynamic* mmap threshold, which starts at 128 KiB and rises to the size of every mmapped block
freed (up to 32 MiB). After the first few large requests, every later one therefore comes
from the heaps of the worker threads' arenas, where freed megabytes stay mapped and fragment:
measured with ``python benchmarks/load.py --flood 20`` (one user submitting and cancelling
1 MiB commands beside the node events), the daemon's RSS grew by 456 MiB. Setting the
threshold explicitly (``mallopt(M_MMAP_THRESHOLD, ...)``) turns the dynamic rule off, so every
block of 128 KiB and more is mmapped and given back when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("offcut.daemon")

#: ``M_MMAP_THRESHOLD`` of glibc's ``mallopt`` (malloc.h)
M_MMAP_THRESHOLD = -3
#: blocks of this size and more are mmapped (and unmapped when freed) [bytes]: glibc's
#: initial threshold, kept fixed
MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` [bytes] for this process (module
    docstring). Returns whether it was set: False where the C library is not glibc (musl,
    macOS), said once in the log at debug level. Never raises."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        log.debug("no glibc mallopt (%s): the mmap threshold stays dynamic", exc)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)) == 1
