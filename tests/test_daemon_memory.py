"""The daemon's heap under large requests (daemon/edge/memory.py; docs/security.md, "Round two: what
one user makes the daemon keep"): with the mmap threshold fixed, every large block is mmapped
(and unmapped when freed) even after large blocks were freed before, which glibc's dynamic
threshold would otherwise keep in the heap. Measured with glibc's own counter of mmapped
blocks (``mallinfo2().hblks``) in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
from offcut.daemon.edge.memory import fix_mmap_threshold
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
blocks = [bytearray(1 << 20) for _ in range(4)]
del blocks                        # freeing mmapped blocks raises glibc's dynamic threshold
blocks = [bytearray(1 << 20) for _ in range(8)]
print(libc.mallinfo2().hblks)     # how many of these 8 are mmapped blocks now
"""


def _mmapped(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


def test_large_blocks_stay_mmapped_after_frees_with_the_fixed_threshold():
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        pytest.skip("not glibc >= 2.33 (no mallinfo2): the threshold fix does not apply")
    assert _mmapped("dynamic") < 8   # glibc's default: later 1 MiB blocks come from the heap
    assert _mmapped("fixed") >= 8    # fixed: each is mmapped, so freeing it unmaps it
