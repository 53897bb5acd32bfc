"""The process's own memory on CPU runs: freed large blocks given back to the system at once.

glibc's malloc serves a block above its mmap threshold with a mapping of its own, unmapped when
the block is freed; below it, from heaps whose freed blocks stay resident for reuse. The
threshold starts at 128 KiB and rises to the size of each mapped block freed (up to 32 MiB), so
after the first large tensor is freed, every later tensor below that size comes from the heaps.
A GRPO step allocates tensors of many sizes phase after phase (the rollout's cache, the logit
chunks, the backward's activations): blocks freed by one phase, of sizes the next does not ask
for, stay resident, and the peak resident memory grows well past what is live at any moment
(bench/memory.py measured about 1 GiB of it in a 4.5 GiB step).

:func:`return_freed_blocks` fixes the threshold: blocks at or above it are mapped and unmapped
each time, so the resident memory follows what is live. The price is page faults: each new
mapping is touched afresh (zeroed by the system), which costs time in proportion to the bytes a
step allocates above the threshold.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter number for the mmap threshold (malloc.h)."""

FREED_BLOCKS_RETURNED_FROM = 1 << 20
"""The threshold ``model.return_freed_memory`` sets: at 1 MiB, a GRPO step's activations and
logit chunks are mapped (bench/memory.py: peak 4.48 -> 3.48 GiB at 1,024 tokens) while the
small tensors of short steps stay in the heaps."""

ENV_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
"""The environment variable glibc reads at start for the same setting."""


def return_freed_blocks(threshold_bytes: int) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` for this process (it no longer rises):
    blocks of that size and more go back to the system when freed.

    Left alone where the process does not run on glibc, or where ``MALLOC_MMAP_THRESHOLD_`` is
    set in the environment (the user's own choice, which glibc has applied).

    Returns:
        Whether the threshold is now the one asked for.
    """
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be positive, not {threshold_bytes}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if os.environ.get(ENV_THRESHOLD):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes))
