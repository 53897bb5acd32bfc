"""grpokit's C++ CPU kernels (the ``kernels`` directory), compiled for this machine on first use.

Each source file is one library of torch operators: ``decode.cpp`` the static decoder's step
(grpokit.native.fused), ``logits.cpp`` the log-softmax statistics of the training loss
(grpokit.core.logprobs). They are compiled with the machine's C++ compiler against the installed
torch (about 15 s each) and cached under ``$GRPOKIT_CACHE/kernels`` (default
``~/.cache/grpokit``), keyed by the source and the headers it shares, torch's version and the
CPU's instruction set (the build targets this CPU). With no compiler, or a failed build, each
user keeps its torch operations and says why once. scripts/setup.sh builds them ahead of time
(:func:`main`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.files import cache_root

logger = logging.getLogger(__name__)

KERNELS = Path(__file__).with_name("kernels")
"""The C++ sources: one library per ``.cpp`` file, sharing the ``.h`` files beside them."""

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


def _command(compiler: str, source: Path, output: Path, flags: Sequence[str]) -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        compiler,
        *flags,
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        str(source),
        "-o",
        str(output),
        f"-L{torch_lib}",
        f"-Wl,-rpath,{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
    ]


def build(name: str, directory: Path | None = None, extra_flags: Sequence[str] = ()) -> Path:
    """Compile ``kernels/<name>.cpp`` (or find it compiled) and return the shared library's path.
    ``extra_flags`` follow :data:`FLAGS` (tests build without AVX-512 this way).

    Raises:
        RuntimeError: no C++ compiler, or the compiler failed (its output in the message).
    """
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise RuntimeError("no C++ compiler (c++ or g++ on PATH, or $CXX)")
    source = KERNELS / f"{name}.cpp"
    flags = [*FLAGS, *extra_flags]
    key = hashlib.sha256(
        b"\0".join(
            [
                source.read_bytes(),
                *(header.read_bytes() for header in sorted(KERNELS.glob("*.h"))),
                torch.__version__.encode(),
                " ".join(flags).encode(),
                compiler.encode(),
                _cpu_key().encode(),
            ]
        )
    ).hexdigest()[:16]
    directory = directory or cache_root() / "kernels"
    target = directory / f"{name}-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: concurrent first uses (test workers, ranks)
    # each build, and none loads a half-written file.
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        partial = Path(tmp) / target.name
        done = subprocess.run(
            _command(compiler, source, partial, flags), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{done.stderr[-2000:]}")
        os.replace(partial, target)
    return target


def load(name: str, namespace: str, switch: str, what: str) -> Any | None:
    """``torch.ops.<namespace>``, the operators of ``kernels/<name>.cpp``, built and loaded; None
    where the environment variable ``switch`` is "0" or they cannot be built (logged once per
    caller, which caches the answer; ``what`` says what is used instead)."""
    if os.environ.get(switch, "1") == "0":
        return None
    try:
        torch.ops.load_library(str(build(name)))  # type: ignore[no-untyped-call]
    except (RuntimeError, OSError) as error:
        logger.warning("grpokit's %s kernels unavailable, %s: %s", name, what, error)
        return None
    return getattr(torch.ops, namespace)


def main() -> int:
    """Build every library ahead of time; exit 1 (with the reason) where one cannot be built."""
    status = 0
    for source in sorted(KERNELS.glob("*.cpp")):
        try:
            print(build(source.stem))
        except (RuntimeError, OSError) as error:  # OSError: $CXX names no program
            print(
                f"grpokit: {source.stem} kernels not built ({error}); torch operations are used "
                "instead"
            )
            status = 1
    return status
