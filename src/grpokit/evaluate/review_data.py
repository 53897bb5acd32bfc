"""Human review: the samples of a directory, the grades asked for, and the label database.

``grpokit review DIR`` reads the samples that grpokit wrote there: a run directory's
``completions.jsonl`` (with ``metrics.jsonl``), a ``grpokit eval`` output (``completions.jsonl``
beside ``eval.json``), or the JSONL file of ``grpokit generate --out`` (the file itself, or the
directory holding it). Each sample keeps the scores its rewards gave (the total, each reward, and
each checklist item as ``checklist/<item>``); the reviewer never sees them.

Labels live in SQLite beside the samples (``review.sqlite``; for a generate file
``<stem>.review.sqlite``), in WAL mode and committed one sample at a time, so the server can be
stopped at any moment and resumed. The database records which samples it belongs to (a hash of
the first sample), the shuffle seed and the items graded; a database made for other samples is
refused.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from grpokit.data.chat import prompt_text as chat_prompt_text
from grpokit.errors import UserError
from grpokit.evaluate.rundir import read_jsonl
from grpokit.rewards.builtin.checklist import ChecklistItem
from grpokit.rewards.text import completion_text

DB_FORMAT = "grpokit-review/1"
DB_NAME = "review.sqlite"
PART_PREFIX = "checklist/"
TOTAL = "total"
"""The score key of a sample's weighted reward total."""
SCORE_LEVELS = 5
"""A one-score review grades 1..5; stored as (grade - 1) / 4 in [0, 1]."""

SourceKind = Literal["run", "eval", "generate"]


@dataclass(frozen=True)
class ReviewSample:
    """One completion to review. ``origin`` (the model or step) and ``scores`` stay hidden."""

    id: str
    prompt: str
    completion: str
    origin: str
    scores: dict[str, float | None]
    """``total``, each reward by name and each checklist item as ``checklist/<item>``."""


@dataclass(frozen=True)
class GradeItem:
    """One yes/no item the reviewer grades (a checklist item of the config)."""

    name: str
    weight: float
    text: str
    """What the reviewer reads: the item's question, or its name for a program check."""


@dataclass(frozen=True)
class SampleSource:
    """The samples of a directory and where their labels go."""

    kind: SourceKind
    path: Path
    """The directory given (or the generate file)."""
    samples_file: Path
    db_path: Path
    samples: list[ReviewSample]
    config: dict[str, Any] | None
    """The run's config.yaml, parsed (runs only)."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _sample_id(line: int, prompt: str, completion: str) -> str:
    # The line keeps two equal completions apart; the texts tie the label to what was shown.
    digest = hashlib.sha256(f"{line}\0{prompt}\0{completion}".encode()).hexdigest()
    return digest[:16]


def _sample(line: int, row: dict[str, Any], kind: SourceKind) -> ReviewSample | None:
    raw = row.get("text") if kind == "generate" else row.get("completion")
    if raw is None:
        return None
    prompt = row.get("prompt")
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        prompt_text = chat_prompt_text(prompt)  # the system prompt left out, as in the logs
    else:
        prompt_text = prompt if isinstance(prompt, str) else completion_text(prompt)
    completion = completion_text(raw)
    scores: dict[str, float | None] = {
        TOTAL: _number(row.get("total" if kind == "generate" else "reward"))
    }
    for group in ("rewards", "parts"):
        values = row.get(group)
        if isinstance(values, dict):
            scores.update({str(k): _number(v) for k, v in values.items()})
    origin = f"step {row['step']}" if kind == "run" else str(row.get("model", "?"))
    return ReviewSample(
        id=_sample_id(line, prompt_text, completion),
        prompt=prompt_text,
        completion=completion,
        origin=origin,
        scores=scores,
    )


def _read_samples(path: Path, kind: SourceKind) -> list[ReviewSample]:
    rows, _ = read_jsonl(path)
    return [s for line, row in rows if (s := _sample(line, row, kind)) is not None]


def _looks_generated(path: Path) -> bool:
    rows, _ = read_jsonl(path)
    return bool(rows) and all("text" in r and "model" in r for _, r in rows[:5])


def find_samples(path: Path) -> SampleSource:
    """The samples under ``path`` (a run, an eval output, a generate file or its directory)."""
    path = Path(path)
    if path.is_file():
        if not _looks_generated(path):
            raise UserError(
                f"{path}: not a `grpokit generate --out` file (JSON lines with model and text); "
                "give a run directory, a `grpokit eval` output directory or such a file"
            )
        kind: SourceKind = "generate"
        samples_file = path
        db_path = path.with_name(f"{path.stem}.review.sqlite")
    elif path.is_dir():
        samples_file = path / "completions.jsonl"
        db_path = path / DB_NAME
        if samples_file.is_file():
            kind = "eval" if (path / "eval.json").is_file() else "run"
        else:
            found = sorted(p for p in path.glob("*.jsonl") if _looks_generated(p))
            if len(found) != 1:
                what = (
                    f"{len(found)} `grpokit generate` files ({', '.join(p.name for p in found)}); "
                    "give one of them"
                    if found
                    else "no completions.jsonl (a run or `grpokit eval` output) and no "
                    "`grpokit generate --out` file"
                )
                raise UserError(f"{path}: {what}")
            return find_samples(found[0])
    else:
        raise UserError(f"{path} does not exist; give a run directory, an eval output or a file")
    samples = _read_samples(samples_file, kind)
    if not samples:
        raise UserError(
            f"{samples_file} holds no samples to review (no line with a prompt and a completion)"
        )
    config = None
    if kind == "run" and (path / "config.yaml").is_file():
        try:
            loaded = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
            config = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError:
            config = None
    return SampleSource(kind, path, samples_file, db_path, samples, config)


def _question_text(question: str) -> str:
    return question.replace("{completion}", "[the answer]").replace("{prompt}", "[the request]")


def checklist_items(config: dict[str, Any] | None, where: str = "config") -> list[GradeItem]:
    """The items of every ``checklist`` reward in a config (parsed YAML), in order."""
    out: list[GradeItem] = []
    for i, entry in enumerate((config or {}).get("rewards") or []):
        if not isinstance(entry, dict) or entry.get("type") != "checklist":
            continue
        for j, raw in enumerate(entry.get("items") or []):
            try:
                item = ChecklistItem.model_validate(raw)
            except ValidationError as e:
                msg = e.errors()[0]["msg"].removeprefix("Value error, ")
                raise UserError(f"{where}: rewards[{i}].items[{j}]: {msg}") from None
            text = _question_text(item.question) if item.question is not None else item.name
            out.append(GradeItem(item.name, item.weight, text))
    return out


def items_from_scores(samples: Sequence[ReviewSample]) -> list[GradeItem]:
    """Checklist items named by the samples' scores (``checklist/<item>``), when no config says."""
    names: dict[str, None] = {}
    for s in samples:
        for key in s.scores:
            if key.startswith(PART_PREFIX):
                names[key.removeprefix(PART_PREFIX)] = None
    return [GradeItem(n, 1.0, n) for n in names]


def load_config_file(path: Path) -> dict[str, Any]:
    """A config file as parsed YAML (only its rewards are read here)."""
    if not path.is_file():
        raise UserError(f"--config {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise UserError(f"--config {path} is not valid YAML: {e}") from None
    if not isinstance(loaded, dict):
        raise UserError(f"--config {path}: expected a mapping with a rewards: list")
    return loaded


def overall(grades: dict[str, int], items: Sequence[GradeItem]) -> float | None:
    """The person's overall score of a sample from item grades: their weighted mean, as the
    checklist reward combines its items."""
    present = [(grades[i.name], i.weight) for i in items if i.name in grades]
    total = sum(w for _, w in present)
    if not present or total <= 0:
        return None
    return sum(g * w for g, w in present) / total


# ---- the label database -------------------------------------------------------------------------


@dataclass(frozen=True)
class Label:
    sample_id: str
    reviewer: str
    score: float | None
    """The person's overall score in [0, 1]."""
    grades: dict[str, int]
    """Item name -> 1 (yes) or 0 (no); empty in a one-score review."""
    note: str
    updated: str


def identity(samples: Sequence[ReviewSample]) -> str:
    """What ties a database to its samples: the first sample's id (a run's completions.jsonl
    grows as it trains; its first line stays)."""
    return samples[0].id


@contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    # closing() closes the file; the connection's own context commits (or rolls back).
    with closing(sqlite3.connect(path, timeout=30.0)) as conn, conn:
        yield conn


class LabelStore:
    """The labels of one sample source, in SQLite. Every call opens its own connection, so the
    server's threads share nothing but the file."""

    def __init__(self, path: Path, meta: dict[str, str]) -> None:
        self.path = path
        self.meta = meta
        self.items = [GradeItem(**i) for i in json.loads(meta["items"])]
        self.seed = int(meta["seed"])

    @property
    def mode(self) -> Literal["checklist", "score"]:
        return "checklist" if self.items else "score"

    @classmethod
    def open(
        cls,
        source: SampleSource,
        items: Sequence[GradeItem],
        *,
        seed: int | None = None,
        db_path: Path | None = None,
        create: bool = True,
    ) -> LabelStore:
        """Open (or create) the database of ``source``; refuse one made for other samples."""
        path = Path(db_path) if db_path is not None else source.db_path
        ident = identity(source.samples)
        if not path.is_file():
            if not create:
                raise UserError(
                    f"{path} does not exist: no labels yet; run `grpokit review {source.path}` "
                    "and grade some samples first"
                )
            with _connect(path) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(
                    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                    "CREATE TABLE labels (sample_id TEXT NOT NULL, reviewer TEXT NOT NULL,"
                    " score REAL, grades TEXT NOT NULL, note TEXT NOT NULL,"
                    " updated TEXT NOT NULL, PRIMARY KEY (sample_id, reviewer));"
                )
                meta = {
                    "format": DB_FORMAT,
                    "identity": ident,
                    "source": str(source.samples_file.resolve()),
                    "kind": source.kind,
                    "seed": str(
                        seed if seed is not None else random.SystemRandom().randrange(2**31)
                    ),
                    "items": json.dumps([i.__dict__ for i in items]),
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
                conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
            return cls(path, meta)
        try:
            with _connect(path) as conn:
                meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as e:
            raise UserError(
                f"{path} is not a grpokit review database ({e}); move it away"
            ) from None
        if meta.get("format") != DB_FORMAT or "items" not in meta or "seed" not in meta:
            raise UserError(f"{path} is not a grpokit review database; move it away")
        if meta.get("identity") != ident:
            raise UserError(
                f"{path} holds the labels of other samples ({meta.get('source')}), not those of "
                f"{source.samples_file}: move it away, or give --db a new file for these samples"
            )
        return cls(path, meta)

    def order(self, samples: Sequence[ReviewSample]) -> list[ReviewSample]:
        """The samples in the review order: shuffled with the database's seed (blind to the
        model and the step that wrote them)."""
        shuffled = list(samples)
        random.Random(self.seed).shuffle(shuffled)
        return shuffled

    def save(self, sample_id: str, reviewer: str, grades: dict[str, int], score: float | None,
             note: str) -> Label:  # fmt: skip
        """Record (or replace) one reviewer's label of one sample; committed at once."""
        if self.items:
            names = [i.name for i in self.items]
            if sorted(grades) != sorted(names) or any(g not in (0, 1) for g in grades.values()):
                raise ValueError(f"grade every item ({', '.join(names)}) with 0 or 1")
            score = overall(grades, self.items)
        elif score is None or not 0.0 <= score <= 1.0:
            raise ValueError("a score in [0, 1] is required")
        label = Label(sample_id, reviewer, score, dict(grades), note,
                      datetime.now(timezone.utc).isoformat(timespec="seconds"))  # fmt: skip
        with _connect(self.path) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO labels VALUES (?, ?, ?, ?, ?, ?)",
                (sample_id, reviewer, score, json.dumps(grades), note, label.updated),
            )
        return label

    def labels(self, reviewer: str | None = None) -> list[Label]:
        """Every label (of one reviewer when given), oldest first."""
        query = "SELECT sample_id, reviewer, score, grades, note, updated FROM labels"
        args: tuple[str, ...] = ()
        if reviewer is not None:
            query += " WHERE reviewer = ?"
            args = (reviewer,)
        with _connect(self.path) as conn:
            rows = conn.execute(query + " ORDER BY updated, rowid", args).fetchall()
        return [Label(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5]) for r in rows]

    def reviewers(self) -> list[str]:
        return sorted({label.reviewer for label in self.labels()})
