"""Per-step metrics of simulated GRPO runs at the noise level of the arithmetic demo.

The demo trains on 2 prompts x 8 completions a step, with a format reward that is nearly always
met after the SFT warm-start and an answer reward at 40-60%. Its per-step means are noisy above
all because a step sees only two prompts: an easy pair passes most samples, a hard pair almost
none. The simulation draws each prompt's success rate p_i from a Beta distribution with mean
``answer`` and intra-prompt correlation ``rho`` = 1 / (a + b + 1), then 8 samples from it, so
the answer pass rate of a step has a standard deviation of about 0.2 (at 0.5, rho 0.3). The text
metrics get the spreads of a few dozen completions (length sd 3 tokens, repeated 3-gram share sd
0.015, distinct-2 sd 0.03); KL grows with multiplicative noise.

``hack_at`` starts reward hacking at that step: the answer collapses to 5% within 3 steps while
the format stays at its maximum, a third reward ("judge", paying for something else) climbs, and
completions grow 30 tokens longer over 10 steps and repeat themselves (repeated 3-gram share
+0.3, distinct-2 -0.3 over 5 steps).
"""

from __future__ import annotations

import numpy as np

REWARDS = ["format", "answer", "judge"]
REWARD_MAX = {"format": 1.0, "answer": 1.0, "judge": 1.0}


def demo_metrics(
    seed: int,
    *,
    steps: int = 60,
    answer: tuple[float, float] = (0.40, 0.62),
    hack_at: int | None = None,
    prompts: int = 2,
    samples: int = 8,
    rho: float = 0.3,
) -> list[dict[str, float]]:
    """One run's metrics.jsonl rows (steps 1..steps); ``answer`` is the level at start and end."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    level = answer[0] + (answer[1] - answer[0]) * (t - 1) / max(steps - 1, 1)
    format_p = np.full(steps, 0.97)
    length = np.full(steps, 40.0)
    repeated = np.full(steps, 0.06)
    distinct = np.full(steps, 0.6)
    judge = np.full(steps, 0.3)
    if hack_at is not None:
        since = np.clip(t - hack_at + 1, 0, None)
        start = level[hack_at - 1]
        level = np.where(since > 0, start + (0.05 - start) * np.minimum(since / 3, 1), level)
        format_p = np.where(since > 0, 1.0, format_p)
        length = length + 30 * np.minimum(since / 10, 1)
        repeated = repeated + 0.3 * np.minimum(since / 5, 1)
        distinct = distinct - 0.3 * np.minimum(since / 5, 1)
        judge = judge + 0.6 * np.minimum(since / 10, 1)
    ab = 1 / rho - 1
    mu = np.clip(level, 0.01, 0.99)[:, None]
    p = rng.beta(mu * ab, (1 - mu) * ab, size=(steps, prompts))
    n = prompts * samples
    answer_rate = rng.binomial(samples, p).sum(axis=1) / n
    format_rate = rng.binomial(n, format_p) / n
    judge_mean = np.clip(judge + rng.normal(0, 0.05, steps), 0, 1)
    noise = rng.normal(size=(6, steps))
    rows = []
    for i in range(steps):
        rows.append(
            {
                "reward": float(format_rate[i] + answer_rate[i] + judge_mean[i]),
                "rewards/format/mean": float(format_rate[i]),
                "pass_rate/format": float(format_rate[i]),
                "rewards/answer/mean": float(answer_rate[i]),
                "pass_rate/answer": float(answer_rate[i]),
                "rewards/judge/mean": float(judge_mean[i]),
                "completions/mean_length": float(length[i] + 3 * noise[0, i]),
                "entropy": float(0.5 - 0.1 * i / steps + 0.03 * noise[1, i]),
                "kl": float(0.002 * (i + 1) ** 0.8 * np.exp(0.3 * noise[2, i])),
                "completions/repeated_ngram_frac": float(
                    max(0.0, repeated[i] + 0.015 * noise[3, i])
                ),
                "completions/distinct_2": float(distinct[i] + 0.03 * noise[4, i]),
                "completions/max_group_duplicate_frac": float(
                    min(1.0, 0.125 + 0.125 * rng.poisson(0.5))
                ),
            }
        )
    return rows
