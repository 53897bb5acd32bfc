"""Sample directories as grpokit eval, train and generate write them (for the review tests)."""

from __future__ import annotations

import json
from pathlib import Path

HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"> \'q\' "dq" &amp;'
CHECKLIST_CONFIG = """\
model: {name_or_path: smollm2-135m-instruct}
data: {train: train.jsonl}
rewards:
  - {type: xml_format}
  - type: checklist
    name: quality
    items:
      - {name: price, regex: '\\d+ ?(usd|yen)', weight: 2}
      - name: customer
        question: "Proposal:\\n{completion}\\nDoes it name a concrete customer? Answer yes or no."
    judges: [{backend: openai, base_url: "http://127.0.0.1:9/v1", model: m}]
"""


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


def eval_rows(prompts: int = 3, per_prompt: int = 2) -> list[dict[str, object]]:
    """Two models x prompts x samples, with checklist item scores; sample 0 of prompt 0 of the
    base model carries hostile markup."""
    rows: list[dict[str, object]] = []
    for model in ("base", "trained"):
        for p in range(prompts):
            for k in range(per_prompt):
                i = len(rows)
                text = f"Plan {i}: sell tea for {10 + i} usd to students."
                if model == "base" and p == 0 and k == 0:
                    text = HOSTILE
                price = float(i % 2)
                customer = 0.2 + 0.6 * ((i // 2) % 2)
                rows.append({
                    "model": model, "prompt_index": p, "sample": k,
                    "prompt": f"Business idea #{p} <b>bold</b>", "completion": text,
                    "reward": 1.0 + (2 * price + customer) / 3, "length": 12, "truncated": False,
                    "rewards": {"xml_format": 1.0, "quality": (2 * price + customer) / 3},
                    "parts": {"checklist/price": price, "checklist/customer": customer},
                })  # fmt: skip
    return rows


def make_eval_dir(path: Path, rows: list[dict[str, object]] | None = None) -> Path:
    path.mkdir(parents=True)
    _write(path / "completions.jsonl", rows if rows is not None else eval_rows())
    (path / "eval.json").write_text("{}", encoding="utf-8")
    return path


def make_generate_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"prompt": f"Say hi #{p}", "model": m, "prompt_index": p, "sample": 0,
         "text": f"hi {m} {p}", "total": None, "rewards": {}, "length": 3, "truncated": False}
        for m in ("a", "b") for p in range(2)
    ]  # fmt: skip
    _write(path, rows)
    return path
