"""Where prompts come from: what `datasets.load_dataset` accepts, as TRL users give it.

A local file (.jsonl, .json, .csv, .parquet, .arrow), a folder of such files, a `save_to_disk`
folder, or a Hugging Face hub dataset name with its config, split and revision. `datasets` does
the reading; local JSON and CSV files get a light check first (grpokit.data.local_files) so that
a bad row is reported with its line.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.data.local_files import precheck
from grpokit.errors import UserError

# datasets' packaged builder for each local file suffix.
BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
# A hub dataset id: "name" or "owner/name" (the hub's own character set).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

DataFiles = str | Sequence[str] | Mapping[str, str | Sequence[str]]


@dataclass(frozen=True)
class DatasetSource:
    """The arguments of ``datasets.load_dataset`` that say which rows to read.

    ``path`` is a local file or folder (relative to the config's directory) or a hub dataset
    name; ``name`` the dataset's config; ``split`` a split with an optional slice
    (``train[:500]``, ``train[10%:]``); ``revision`` a hub branch, tag or commit;
    ``data_files`` selects files inside a folder or hub repository.
    """

    path: str
    name: str | None = None
    split: str = "train"
    revision: str | None = None
    data_files: DataFiles | None = None

    def describe(self) -> str:
        extra = [f"{k} {v!r}" for k, v in (("config", self.name), ("revision", self.revision)) if v]
        if self.split != "train":
            extra.append(f"split {self.split!r}")
        return f"{self.path!r}" + (f" ({', '.join(extra)})" if extra else "")


@dataclass
class Records:
    """Rows read from a source, as dicts, and where each row is for messages."""

    rows: list[dict[str, Any]]
    column_names: list[str]
    where: Callable[[int], str]


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """`datasets` without its progress bars (restored afterwards), imported lazily."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _read_errors() -> tuple[type[BaseException], ...]:
    """What `datasets` raises for input it cannot read (ArrowInvalid is a ValueError)."""
    from datasets.exceptions import DatasetsError

    return (ValueError, OSError, DatasetsError, StopIteration)


def _select_split(ds: Any, split: str, label: str) -> Any:
    """``split`` (with its slice) of a dataset read by ``load_from_disk``."""
    import datasets

    splits = dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
    try:
        parts = datasets.ReadInstruction.from_spec(split).to_absolute(
            {name: len(part) for name, part in splits.items()}
        )
    except (ValueError, AssertionError) as e:
        raise UserError(
            f"{label}: split {split!r}: {_reason(e)} (splits: {', '.join(splits)})"
        ) from None
    selected = [splits[p.splitname].select(range(p.from_, p.to)) for p in parts]
    return datasets.concatenate_datasets(selected) if len(selected) > 1 else selected[0]


def _local_path(path: str, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def _load_local_file(source: DatasetSource, path: Path) -> tuple[Any, list[int] | None]:
    builder = BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise UserError(
            f"{path}: unknown data file type {path.suffix or '(no suffix)'!r}; use "
            f"{', '.join(BUILDERS)}, a folder of such files or a `datasets` save_to_disk folder"
        )
    if source.name or source.revision or source.data_files:
        raise UserError(
            f"{path}: name, revision and data_files apply to a dataset folder or hub name, "
            "not to a single file"
        )
    kwargs: dict[str, Any] = {}
    lines: list[int] | None = None
    if builder in ("json", "csv"):
        header, lines = precheck(path, builder)
        if header is not None:  # CSV: text as written (no number or NA guessing), BOM dropped
            from datasets import Features, Value

            kwargs = {
                "features": Features({name: Value("string") for name in header}),
                "keep_default_na": False,
                "na_filter": False,
                "encoding": "utf-8-sig",
            }
    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory() as cache:
        try:
            ds = datasets.load_dataset(
                builder,
                data_files=str(path),
                split=source.split,
                cache_dir=cache,
                keep_in_memory=True,
                **kwargs,
            )
        except _read_errors() as e:
            raise UserError(
                f"{path}: `datasets` could not read it as {builder}: {_reason(e)}"
            ) from None
    # Rows map to lines only when the whole file is read.
    return ds, lines if source.split == "train" else None


def _load_folder(source: DatasetSource, path: Path) -> Any:
    with _quiet_datasets() as datasets:
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            if source.name or source.revision or source.data_files:
                raise UserError(
                    f"{path}: a save_to_disk folder has no configs, revisions or data_files; "
                    "give only its split"
                )
            try:
                ds = datasets.load_from_disk(str(path), keep_in_memory=True)
            except _read_errors() as e:
                raise UserError(
                    f"{path}: not a readable save_to_disk folder ({_reason(e)})"
                ) from None
            return _select_split(ds, source.split, str(path))
        with tempfile.TemporaryDirectory() as cache:
            try:
                return datasets.load_dataset(
                    str(path),
                    source.name,
                    split=source.split,
                    data_files=source.data_files,
                    revision=source.revision,
                    cache_dir=cache,
                    keep_in_memory=True,
                )
            except _read_errors() as e:
                raise UserError(
                    f"{path}: `datasets` could not read this folder: {_reason(e)}"
                ) from None


def _load_hub(source: DatasetSource) -> Any:
    with _quiet_datasets() as datasets:
        try:
            return datasets.load_dataset(
                source.path,
                source.name,
                split=source.split,
                data_files=source.data_files,
                revision=source.revision,
            )
        except ConnectionError as e:
            raise UserError(
                f"dataset {source.describe()}: the Hugging Face hub cannot be reached "
                f"({_reason(e)}). "
                "Offline (HF_HUB_OFFLINE=1 or no network) only datasets already in the local "
                "cache load: save it where the hub is reachable "
                "(datasets.load_dataset(...).save_to_disk(DIR)) and point the config at DIR"
            ) from None
        except _read_errors() as e:
            raise UserError(
                f"dataset {source.describe()}: could not be loaded: {_reason(e)}"
            ) from None


# Suffixes of files people keep data in besides BUILDERS': a missing "train.xlsx" is a file the
# user meant, and asking the hub for it costs `datasets`' five retries (over 20 s offline).
_FILE_SUFFIXES = {*BUILDERS, ".xlsx", ".xls", ".ods", ".tsv", ".txt", ".yaml", ".yml", ".xml"}


def _looks_like_hub_name(path: str) -> bool:
    """``owner/name`` or ``name``, and not a missing local file: a data file's suffix, or any
    suffix on a name without an owner (the hub's owner-less dataset names have none)."""
    suffix = Path(path).suffix.lower()
    file_like = suffix in _FILE_SUFFIXES or (suffix != "" and "/" not in path)
    return bool(_HUB_ID.match(path)) and not file_like


def _reason(e: BaseException) -> str:
    """An exception's message on one line (`datasets` spreads some over several)."""
    return " ".join(str(e).split())


def read_records(
    source: DatasetSource,
    *,
    base_dir: Path | None = None,
    columns: Mapping[str, str] | None = None,
) -> Records:
    """Read the rows of ``source`` with `datasets`, its columns renamed by ``columns``.

    Args:
        source: what to read; a relative local path resolves against ``base_dir`` (the config's
            directory), else the working directory.
        columns: ``{dataset column: name used by the prompt and rewards}``.

    Raises:
        UserError: naming the file and line (local JSON and CSV), the file, or the hub dataset.
    """
    local = _local_path(source.path, base_dir)
    lines: list[int] | None = None
    if local.is_file():
        ds, lines = _load_local_file(source, local)
        label = str(local)
    elif local.is_dir():
        ds = _load_folder(source, local)
        label = str(local)
    elif _looks_like_hub_name(source.path):
        ds = _load_hub(source)
        label = f"dataset {source.path!r}"
    else:
        raise UserError(f"{local}: no such file or folder, and not a hub dataset name (owner/name)")
    if columns:
        missing = sorted(set(columns) - set(ds.column_names))
        if missing:
            raise UserError(
                f"{label}: data.columns renames {', '.join(map(repr, missing))}, which the data "
                f"does not have (columns: {', '.join(ds.column_names)})"
            )
        try:
            ds = ds.rename_columns(dict(columns))
        except ValueError as e:
            raise UserError(f"{label}: data.columns: {_reason(e)}") from None
    if len(ds) == 0:
        raise UserError(f"{label}: no prompts (split {source.split!r} has no rows)")

    def where(i: int) -> str:
        return f"{label}:{lines[i]}" if lines is not None else f"{label}: row {i + 1}"

    return Records(ds.to_list(), list(ds.column_names), where)
