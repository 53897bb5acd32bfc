"""A persistent SQLite cache of judge scores.

Keyed by the judge's identity (backend, endpoint, model, sampling settings), the scoring mode and
scale, the rubric and the full judge prompt, so the same completion judged the same way is
answered from disk: evaluation, a resumed run and ``rewards check`` cost nothing. Only replies
that came back are stored (a parse failure included: a greedy judge repeats it); transport
failures are not, so they are retried next time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from grpokit.errors import UserError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_scores (
    key TEXT PRIMARY KEY,
    judge TEXT NOT NULL,
    score REAL,
    reply TEXT NOT NULL,
    created REAL NOT NULL
)
"""


@dataclass(frozen=True)
class CachedScore:
    """A stored judge result: the normalised score (None for a parse failure) and the reply."""

    score: float | None
    reply: str


def cache_key(judge_identity: str, rubric_digest: str, scoring: str, judge_prompt: str) -> str:
    """The cache key of one judge request (a hex digest)."""
    payload = json.dumps([judge_identity, rubric_digest, scoring, judge_prompt], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class JudgeCache:
    """Judge scores on disk. Safe to share between threads; several processes may open the same
    file (SQLite WAL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(_SCHEMA)
            self._conn.commit()
        except (OSError, sqlite3.Error) as exc:
            raise UserError(
                f"judge cache {path}: cannot open it ({exc}). Set cache_path to a writable file "
                "or cache: false."
            ) from exc
        self._lock = threading.Lock()

    def get_many(self, keys: Iterable[str]) -> dict[str, CachedScore]:
        """The stored results among ``keys``."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, CachedScore] = {}
        with self._lock:
            # SQLite limits bound parameters per statement; 500 is safely below every default.
            for i in range(0, len(wanted), 500):
                chunk = wanted[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._conn.execute(
                    f"SELECT key, score, reply FROM judge_scores WHERE key IN ({marks})", chunk
                ).fetchall()
                for key, score, reply in rows:
                    found[key] = CachedScore(score=score, reply=reply)
        return found

    def put_many(self, judge: str, entries: Mapping[str, CachedScore]) -> None:
        """Store results (replacing older ones under the same key) in one transaction."""
        if not entries:
            return
        now = time.time()
        rows = [(key, judge, e.score, e.reply, now) for key, e in entries.items()]
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO judge_scores (key, judge, score, reply, created) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._conn.execute("SELECT COUNT(*) FROM judge_scores").fetchone()
        return int(count)

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()
