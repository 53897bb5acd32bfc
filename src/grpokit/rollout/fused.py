"""Fused CPU kernels for the static decoder's step (kernels/decode.cpp), built once per machine.

A decoding step at the batch sizes of a rollout is, besides the linear layers, about 40 small
eager operations per layer (norms, rotary embedding, cache writes, attention over the cache, the
gated activation): on the embedded model at batch 8 they took half of a step, mostly in dispatch
and intermediate tensors (bench/README.md). Four kernels here do the same arithmetic in four
calls per layer, rounding to the compute dtype where the eager code rounds; a fifth adds a LoRA
adapter's share to a projection (one call where the eager code makes two products per adapter,
a scaling and a sum).

They are compiled with the machine's C++ compiler against the installed torch on first use
(about 15 s) and cached under ``$GRPOKIT_CACHE/kernels`` (default ``~/.cache/grpokit``), keyed
by the source, torch's version and the CPU's instruction set (the build targets this CPU). With
no compiler, or a failed build, the decoder keeps its eager step and says why once;
``GRPOKIT_FUSED_DECODE=0`` keeps it too (for comparisons). scripts/setup.sh builds them ahead
of time (:func:`main`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from grpokit.model_files.embedded import cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels") / "decode.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++20", "-w"]
"""-march=native: the build is for this CPU (its hash is in the file's name); -fopenmp: torch's
``at::parallel_for`` is header code that uses OpenMP, resolved against the libgomp torch loaded."""


def _cpu_key() -> str:
    """What the instruction set of this CPU is, for the build's name: a machine whose CPU
    differs (a shared home directory on a mixed cluster) builds its own."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()


def _command(compiler: str, output: Path) -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        compiler,
        *FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        str(SOURCE),
        "-o",
        str(output),
        f"-L{torch_lib}",
        f"-Wl,-rpath,{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
    ]


def build(directory: Path | None = None) -> Path:
    """Compile the kernels (or find them compiled) and return the shared library's path.

    Raises:
        RuntimeError: no C++ compiler, or the compiler failed (its output in the message).
    """
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise RuntimeError("no C++ compiler (c++ or g++ on PATH, or $CXX)")
    key = hashlib.sha256(
        b"\0".join(
            [
                SOURCE.read_bytes(),
                torch.__version__.encode(),
                " ".join(FLAGS).encode(),
                compiler.encode(),
                _cpu_key().encode(),
            ]
        )
    ).hexdigest()[:16]
    directory = directory or cache_root() / "kernels"
    target = directory / f"decode-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: concurrent first uses (test workers, ranks)
    # each build, and none loads a half-written file.
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        partial = Path(tmp) / target.name
        done = subprocess.run(_command(compiler, partial), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{done.stderr[-2000:]}")
        os.replace(partial, target)
    return target


@functools.cache
def decode_kernels() -> Any | None:
    """``torch.ops.grpokit_decode`` (add_rms_norm, rope_cache, decode_attention, silu_mul,
    lora_add), built and loaded on first call; None where they cannot be (logged once) or are
    switched off."""
    if os.environ.get("GRPOKIT_FUSED_DECODE", "1") == "0":
        return None
    try:
        torch.ops.load_library(str(build()))  # type: ignore[no-untyped-call]
    except (RuntimeError, OSError) as error:
        logger.warning("fused decode kernels unavailable, decoding with eager ops: %s", error)
        return None
    return torch.ops.grpokit_decode


def main() -> int:
    """Build the kernels ahead of time; exit 1 (with the reason) where they cannot be built."""
    try:
        print(build())
    except (RuntimeError, OSError) as error:  # OSError: $CXX names no program
        print(f"grpokit: fused decode kernels not built ({error}); decoding uses eager ops")
        return 1
    return 0
