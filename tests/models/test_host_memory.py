"""glibc's mmap threshold fixed: freed blocks leave the resident memory at once."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from grpokit.models.host_memory import ENV_THRESHOLD, return_freed_blocks

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# In a process of its own (the setting is process-wide), through glibc's malloc as torch's CPU
# tensors are: free a 16 MiB block, which raises glibc's default threshold to its size, then
# allocate and touch 64 blocks of 2 MiB and one more above them (it holds the heap's top, so glibc
# cannot trim what lies below), and free the 64. Prints the resident memory those 64 left behind,
# in MiB. "config" loads a model with the config field first (grpokit's import of torch and the
# model's tensors come before the blocks, as in a run).
RETAINED = """
import ctypes
import sys
from pathlib import Path

from grpokit.models.host_memory import return_freed_blocks

if sys.argv[1] == "fixed":
    assert return_freed_blocks(1 << 20)
if sys.argv[1] == "config":
    from grpokit.config import ModelConfig
    from grpokit.sampling import load_model_policy

    model = ModelConfig(name_or_path=sys.argv[2], device="cpu", return_freed_memory=True)
    load_model_policy(model, base_dir=Path("."), trainable=True)
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def touched(size):
    block = libc.malloc(size)
    libc.memset(block, 1, size)
    return block
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
libc.free(touched(16 << 20))
before = resident()
blocks = [touched(2 << 20) for _ in range(64)]
top = touched(2 << 20)
for block in blocks:
    libc.free(block)
print((resident() - before) / 2**20)
"""


def _retained_mib(*args: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != ENV_THRESHOLD}
    out = subprocess.run(
        [sys.executable, "-c", RETAINED, *args], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_freed_blocks_leave_the_resident_memory() -> None:
    # 64 x 2 MiB = 128 MiB: the default keeps them resident, the fixed threshold returns them.
    assert _retained_mib("default") > 100
    assert _retained_mib("fixed") < 16


@glibc
def test_model_return_freed_memory_sets_it_when_a_model_is_loaded(tiny_model_dir: Path) -> None:
    assert _retained_mib("config", str(tiny_model_dir)) < 16


@glibc
def test_the_users_environment_setting_is_left_alone() -> None:
    code = (
        "from grpokit.models.host_memory import return_freed_blocks; "
        "print(return_freed_blocks(1 << 20))"
    )
    env = os.environ | {ENV_THRESHOLD: "65536"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "False"


def test_a_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        return_freed_blocks(0)
