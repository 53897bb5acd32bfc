"""What the person's labels say about the machine's scores, and the labels as training data.

Agreement, per reviewer, with every score the samples carry:

- per checklist item, Cohen's kappa between the person's yes/no and the item's machine score
  (a judge's probability of yes or a program's 0/1, taken as yes at 0.5 or more);
- overall, Spearman's rank correlation between the person's score (the weighted mean of their
  item grades, or their 1-5 score) and each reward's value and the weighted total;
- and, with two reviewers or more, the same between each pair of people: how far two people
  agree is the ceiling a judge can be held to.

Exports: preference pairs (two samples of one prompt that the person scored differently; TRL's
``prompt`` / ``chosen`` / ``rejected``), and the same pairs in TRL's conversational form with a
``margin`` for its RewardTrainer, whose sequence-classification model ``type: reward_model``
then loads (it scores a chat prompt and completion through the model's chat template, as the
conversational form trains it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from grpokit.core.stats import cohen_kappa, spearman_interval
from grpokit.evaluate.html import table
from grpokit.evaluate.review_data import PART_PREFIX, TOTAL, Label, LabelStore, ReviewSample

MIN_PAIRS = 2
"""Fewer labelled samples than this give no agreement row."""


@dataclass(frozen=True)
class Agreement:
    """One reviewer against one scorer on one item (kappa) or overall (Spearman)."""

    reviewer: str
    scorer: str
    """A reward name, ``total``, a checklist item's ``checklist/<item>``, or another reviewer."""
    item: str | None
    """The checklist item, or None for the overall score."""
    measure: str
    value: float
    low: float
    high: float
    n: int
    agreed: float | None = None
    """Kappa rows: the share of samples graded alike."""


def _fmt(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:+.2f}"


def _kappa_row(reviewer: str, scorer: str, item: str,
               pairs: Sequence[tuple[bool, bool]]) -> Agreement:  # fmt: skip
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    kappa, lo, hi = cohen_kappa(a, b)
    agreed = sum(x == y for x, y in pairs) / len(pairs)
    return Agreement(reviewer, scorer, item, "kappa", kappa, lo, hi, len(pairs), agreed)


def _spearman_row(reviewer: str, scorer: str,
                  pairs: Sequence[tuple[float, float]]) -> Agreement:  # fmt: skip
    rho, lo, hi = spearman_interval([p[0] for p in pairs], [p[1] for p in pairs])
    return Agreement(reviewer, scorer, None, "spearman", rho, lo, hi, len(pairs))


def agreement(samples: Sequence[ReviewSample], store: LabelStore) -> list[Agreement]:
    """Every reviewer against every score present in the samples, and against each other."""
    by_id = {s.id: s for s in samples}
    labels = [label for label in store.labels() if label.sample_id in by_id]
    per_reviewer: dict[str, dict[str, Label]] = {}
    for label in labels:
        per_reviewer.setdefault(label.reviewer, {})[label.sample_id] = label
    score_keys = sorted(
        {k for s in samples for k in s.scores if not k.startswith(PART_PREFIX)},
        key=lambda k: (k != TOTAL, k),
    )
    rows: list[Agreement] = []
    for reviewer, mine in sorted(per_reviewer.items()):
        for item in store.items:
            key = PART_PREFIX + item.name
            pairs = [
                (bool(label.grades[item.name]), machine >= 0.5)
                for sid, label in mine.items()
                if item.name in label.grades and (machine := by_id[sid].scores.get(key)) is not None
            ]
            if len(pairs) >= MIN_PAIRS:
                rows.append(_kappa_row(reviewer, key, item.name, pairs))
        for key in score_keys:
            values = [
                (label.score, machine)
                for sid, label in mine.items()
                if label.score is not None and (machine := by_id[sid].scores.get(key)) is not None
            ]
            if len(values) >= MIN_PAIRS:
                rows.append(_spearman_row(reviewer, key, values))
    for a, b in combinations(sorted(per_reviewer), 2):
        both = [(per_reviewer[a][sid], per_reviewer[b][sid])
                for sid in per_reviewer[a] if sid in per_reviewer[b]]  # fmt: skip
        for item in store.items:
            pairs = [
                (bool(x.grades[item.name]), bool(y.grades[item.name]))
                for x, y in both
                if item.name in x.grades and item.name in y.grades
            ]
            if len(pairs) >= MIN_PAIRS:
                rows.append(_kappa_row(a, f"reviewer {b}", item.name, pairs))
        scores = [
            (x.score, y.score) for x, y in both if x.score is not None and y.score is not None
        ]
        if len(scores) >= MIN_PAIRS:
            rows.append(_spearman_row(a, f"reviewer {b}", scores))
    return rows


HEADER = ["reviewer", "against", "item", "measure", "value", "95% interval", "n", "same grade"]


def agreement_table(rows: Sequence[Agreement]) -> list[list[object]]:
    """The rows as table cells (text), the header being :data:`HEADER`."""
    return [
        [
            r.reviewer,
            r.scorer,
            r.item or "overall",
            "Cohen's kappa" if r.measure == "kappa" else "Spearman",
            _fmt(r.value),
            "–" if math.isnan(r.low) else f"{_fmt(r.low)} … {_fmt(r.high)}",
            str(r.n),
            "" if r.agreed is None else f"{r.agreed:.0%}",
        ]
        for r in rows
    ]


def agreement_text(rows: Sequence[Agreement]) -> str:
    """A plain-text table for the terminal."""
    cells: list[list[object]] = [list(HEADER), *agreement_table(rows)]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def agreement_html(rows: Sequence[Agreement], labelled: int, reviewers: Sequence[str]) -> str:
    """The report's section body (text escaped by :func:`grpokit.evaluate.html.table`)."""
    intro = (
        f'<p class="muted">{labelled} label(s) by {len(reviewers)} reviewer(s), given blind '
        "(model and step hidden, order shuffled). Kappa per checklist item: the person's yes/no "
        "against the item's score (yes at 0.5 or more); Spearman overall: the person's score "
        "against each reward. Kappa near 0 means chance agreement; intervals are 95%.</p>"
    )
    if not rows:
        return intro + '<p class="muted">Too few labels to compare (at least 2 per scorer).</p>'
    return intro + table(HEADER, agreement_table(rows), numeric=False)


# ---- exports ------------------------------------------------------------------------------------


def person_scores(samples: Sequence[ReviewSample], store: LabelStore) -> dict[str, float]:
    """Per sample id: the mean of its reviewers' overall scores."""
    by_sample: dict[str, list[float]] = {}
    known = {s.id for s in samples}
    for label in store.labels():
        if label.score is not None and label.sample_id in known:
            by_sample.setdefault(label.sample_id, []).append(label.score)
    return {sid: sum(v) / len(v) for sid, v in by_sample.items()}


def labelled_pairs(
    samples: Sequence[ReviewSample], scores: dict[str, float]
) -> list[tuple[ReviewSample, ReviewSample, float]]:
    """(better, worse, score difference) for every two labelled samples of one prompt that the
    person scored differently (ties say nothing about which is better)."""
    by_prompt: dict[str, list[ReviewSample]] = {}
    for s in samples:
        if s.id in scores:
            by_prompt.setdefault(s.prompt, []).append(s)
    out: list[tuple[ReviewSample, ReviewSample, float]] = []
    for group in by_prompt.values():
        for x, y in combinations(group, 2):
            diff = scores[x.id] - scores[y.id]
            if abs(diff) > 1e-9:
                better, worse = (x, y) if diff > 0 else (y, x)
                out.append((better, worse, abs(diff)))
    return out


def preference_rows(
    pairs: Sequence[tuple[ReviewSample, ReviewSample, float]],
) -> list[dict[str, Any]]:
    """TRL's standard preference format: ``prompt``, ``chosen``, ``rejected`` as text."""
    return [{"prompt": b.prompt, "chosen": b.completion, "rejected": w.completion}
            for b, w, _ in pairs]  # fmt: skip


def reward_model_rows(
    pairs: Sequence[tuple[ReviewSample, ReviewSample, float]],
) -> list[dict[str, Any]]:
    """TRL's conversational preference format with ``margin`` (the person's score difference,
    in [0, 1]), what its RewardTrainer trains a ``type: reward_model`` checkpoint from."""
    return [
        {
            "prompt": [{"role": "user", "content": b.prompt}],
            "chosen": [{"role": "assistant", "content": b.completion}],
            "rejected": [{"role": "assistant", "content": w.completion}],
            "margin": round(margin, 6),
        }
        for b, w, margin in pairs
    ]
