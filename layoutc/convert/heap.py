"""Freed memory kept in the process for the next layer (``layoutc convert``'s own process only).

glibc's malloc serves blocks of 32 MiB and more from their own memory maps and unmaps them when freed, so
every layer's outputs (hundreds of MB) come in as new pages: a page fault and a zeroed page per 4 KiB. On a
virtual machine whose free memory goes back to its host (the CPU machine), such pages cost about as much
again on first touch. :func:`keep_freed_memory` asks malloc to serve every block from its heap and to keep
freed memory there (``M_MMAP_MAX`` 0, ``M_TRIM_THRESHOLD`` at its largest): the next layer's outputs reuse
the previous layer's pages. Measured on the CPU machine, ``layoutc convert`` of a 2 GB MXFP4 checkpoint:
the process's CPU time in the conversion 4.5-5.0 -> 3.5-4.2 s (BENCHMARKS.md).

Process-wide, so only the ``convert`` command calls it, never the library: a process that imports layoutc
keeps its own allocator settings. The process's peak memory is unchanged (the same blocks, reused); its
resident memory stays at that peak until it exits.
"""

from __future__ import annotations

import ctypes
import sys

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (see the module). False where the C library is not
    glibc (no ``mallopt``, or it refused): the allocator then stays as it was."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 -- glibc's; musl's mallopt accepts and ignores everything
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
