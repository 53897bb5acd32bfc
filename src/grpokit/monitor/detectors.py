"""Reward-hacking detectors over the stream of per-step metrics.

Each detector sees one step's metrics at a time (the dict the trainer writes to metrics.jsonl,
including the text metrics of :func:`grpokit.monitor.text_stats.text_stats`) and returns the
alerts that fired at that step. An alert fires once per episode: when its condition turns true,
not again while it stays true, and again only after it has been false for ``rearm_steps``
consecutive checks. A step that lacks a detector's metrics is not a check.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from grpokit.monitor.config import (
    EntropyRule,
    GroupDominanceRule,
    HeldoutRule,
    KLRule,
    LengthRewardRule,
    MonitorConfig,
    RepetitionRule,
    SaturationRule,
)
from grpokit.monitor.series import mean, median, metric, trend
from grpokit.monitor.text_stats import DISTINCT_2, MAX_GROUP_DUPLICATE_FRAC, REPEATED_NGRAM_FRAC


@dataclass(frozen=True)
class Alert:
    """One monitor firing: which rule, at which step, the number that crossed its threshold."""

    rule: str
    step: int
    value: float
    message: str

    def to_dict(self) -> dict[str, object]:
        """The form stored under "alerts" in metrics.jsonl."""
        return asdict(self)

    def __str__(self) -> str:
        return f"[monitor {self.rule} @ step {self.step}] {self.message}"


class Detector(Protocol):
    """A rule over the metric stream; ``rule`` names it in alerts."""

    rule: str

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]: ...


class Episode:
    """Fire once when a condition turns true; re-arm after it has been false ``rearm`` times."""

    def __init__(self, rearm: int) -> None:
        self._rearm = rearm
        self._armed = True
        self._false_run = 0

    def check(self, condition: bool) -> bool:
        """Record one check; True when this check starts a new episode."""
        if condition:
            self._false_run = 0
            if self._armed:
                self._armed = False
                return True
            return False
        self._false_run += 1
        if self._false_run >= self._rearm:
            self._armed = True
        return False


class LengthRewardDetector:
    """Rule ``length_reward``: mean completion length trending up together with the reward."""

    rule = "length_reward"

    def __init__(self, cfg: LengthRewardRule, rearm: int) -> None:
        self.cfg = cfg
        self._points: deque[tuple[int, float, float]] = deque(maxlen=cfg.window)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        length = metric(metrics, "completions/mean_length")
        reward = metric(metrics, "reward")
        if length is None or reward is None:
            return []
        self._points.append((step, length, reward))
        if len(self._points) < self.cfg.window:
            return []
        corr_len, len_first, len_last = trend([p[1] for p in self._points])
        corr_rew, rew_first, rew_last = trend([p[2] for p in self._points])
        growth = (len_last - len_first) / max(len_first, 1.0)
        fired = self._episode.check(
            corr_len >= self.cfg.min_corr
            and corr_rew >= self.cfg.min_corr
            and growth >= self.cfg.min_rel_growth
        )
        if not fired:
            return []
        first_step = self._points[0][0]
        return [
            Alert(
                self.rule,
                step,
                growth,
                f"completion length grew {growth:.0%} ({len_first:.0f} -> {len_last:.0f} tokens) "
                f"over steps {first_step}-{step} while the reward rose ({rew_first:.3g} -> "
                f"{rew_last:.3g}; Spearman length {corr_len:.2f}, reward {corr_rew:.2f}). Check "
                f"whether the reward pays for length rather than quality.",
            )
        ]


class RepetitionDetector:
    """Rule ``repetition``: repeated n-grams above, or distinct bigrams below, the early level."""

    rule = "repetition"

    def __init__(self, cfg: RepetitionRule, rearm: int) -> None:
        self.cfg = cfg
        self._early_rep: list[float] = []
        self._early_d2: list[float] = []
        self._recent_rep: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._recent_d2: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        rep = metric(metrics, REPEATED_NGRAM_FRAC)
        d2 = metric(metrics, DISTINCT_2)
        if rep is None and d2 is None:
            return []
        in_baseline = False
        for value, early, recent in (
            (rep, self._early_rep, self._recent_rep),
            (d2, self._early_d2, self._recent_d2),
        ):
            if value is None:
                continue
            recent.append(value)
            if len(early) < self.cfg.baseline_steps:
                early.append(value)
                in_baseline = True
        if in_baseline:
            return []
        reasons: list[tuple[float, str]] = []
        if rep is not None and self._early_rep:
            base, now = mean(self._early_rep), mean(self._recent_rep)
            if now - base >= self.cfg.max_increase:
                reasons.append((now, f"repeated n-gram share rose from {base:.2f} to {now:.2f}"))
        if d2 is not None and self._early_d2:
            base, now = mean(self._early_d2), mean(self._recent_d2)
            if now < self.cfg.min_distinct_ratio * base:
                reasons.append((now, f"distinct-2 fell from {base:.2f} to {now:.2f}"))
        if not self._episode.check(bool(reasons)):
            return []
        value = reasons[0][0]
        text = "; ".join(r[1] for r in reasons)
        return [
            Alert(
                self.rule,
                step,
                value,
                f"completions repeat themselves: {text} (early level: the first "
                f"{self.cfg.baseline_steps} steps). Look for looping branches or phrases the "
                f"reward pays for; a repetition_penalty reward guards against it.",
            )
        ]


class KLDetector:
    """Rules ``kl_high`` (kl above a ceiling) and ``kl_jump`` (kl a multiple of its recent median)."""

    rule = "kl_high"
    jump_rule = "kl_jump"

    def __init__(self, cfg: KLRule, rearm: int) -> None:
        self.cfg = cfg
        self._history: deque[float] = deque(maxlen=cfg.jump_window)
        self._high = Episode(rearm)
        self._jump = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        kl = metric(metrics, "kl")
        if kl is None:
            return []
        alerts: list[Alert] = []
        if self._high.check(kl > self.cfg.max_kl):
            alerts.append(
                Alert(
                    self.rule,
                    step,
                    kl,
                    f"KL to the reference is {kl:.3g}, above {self.cfg.max_kl:g}: the policy has "
                    f"drifted far from the reference. Raise beta, lower the learning rate, or "
                    f"check the samples for degenerate text.",
                )
            )
        if len(self._history) >= self.cfg.jump_min_history:
            # The floor keeps a near-zero median (KL starts at 0) from making any value a jump.
            ref = max(median(self._history), self.cfg.jump_min / self.cfg.jump_ratio)
            ratio = kl / ref
            jumped = kl >= self.cfg.jump_min and ratio >= self.cfg.jump_ratio
            if self._jump.check(jumped):
                alerts.append(
                    Alert(
                        self.jump_rule,
                        step,
                        kl,
                        f"KL jumped to {kl:.3g}, {ratio:.1f}x its median {median(self._history):.3g} "
                        f"over the previous {len(self._history)} steps. A sudden policy change: "
                        f"look at the samples of this step.",
                    )
                )
        self._history.append(kl)
        return alerts


class HeldoutDetector:
    """Rule ``heldout_divergence``: training reward up since the held-out eval's best, eval down.

    Pairs ``rewards/<name>/mean`` with ``eval/<name>/mean`` for each reward, and the total
    ``reward`` with ``eval/reward`` (or ``eval/reward/mean``) when a total eval reward is logged.
    """

    rule = "heldout_divergence"

    def __init__(self, cfg: HeldoutRule, rearm: int, reward_names: Sequence[str]) -> None:
        self.cfg = cfg
        self._pairs = [(f"rewards/{n}/mean", f"eval/{n}/mean", n) for n in reward_names]
        self._pairs.append(("reward", "eval/reward", "total reward"))
        self._train: dict[str, deque[float]] = {
            t: deque(maxlen=cfg.smooth_steps) for t, _, _ in self._pairs
        }
        self._train_at: dict[str, dict[int, float]] = {t: {} for t, _, _ in self._pairs}
        self._evals: dict[str, list[tuple[int, float]]] = {e: [] for _, e, _ in self._pairs}
        self._episodes = {e: Episode(rearm) for _, e, _ in self._pairs}

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        alerts: list[Alert] = []
        for train_key, eval_key, label in self._pairs:
            train = metric(metrics, train_key)
            if train is not None:
                self._train[train_key].append(train)
            if self._train[train_key]:
                self._train_at[train_key][step] = mean(self._train[train_key])
            value = metric(metrics, eval_key)
            if value is None and eval_key == "eval/reward":
                value = metric(metrics, "eval/reward/mean")
            if value is None:
                continue
            history = self._evals[eval_key]
            history.append((step, value))
            train_now = self._train_at[train_key].get(step)
            if len(history) < 2 or train_now is None:
                continue
            peak_step, peak = max(history[:-1], key=lambda p: p[1])
            train_then = self._train_at[train_key].get(peak_step)
            if train_then is None:
                continue
            drop, rise = peak - value, train_now - train_then
            diverged = drop >= self.cfg.min_eval_drop and rise >= self.cfg.min_train_rise
            if self._episodes[eval_key].check(diverged):
                alerts.append(
                    Alert(
                        self.rule,
                        step,
                        drop,
                        f"{label}: held-out mean fell from {peak:.3g} (step {peak_step}) to "
                        f"{value:.3g} while the training reward rose from {train_then:.3g} to "
                        f"{train_now:.3g}. The policy is learning what the training prompts "
                        f"reward, not the task: compare samples, consider an earlier checkpoint.",
                    )
                )
        return alerts


class EntropyDetector:
    """Rule ``entropy_collapse``: smoothed entropy below a floor or a fraction of its early level."""

    rule = "entropy_collapse"

    def __init__(self, cfg: EntropyRule, rearm: int) -> None:
        self.cfg = cfg
        self._early: list[float] = []
        self._recent: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        entropy = metric(metrics, "entropy")
        if entropy is None:
            return []
        self._recent.append(entropy)
        if len(self._early) < self.cfg.baseline_steps:
            self._early.append(entropy)
        now = mean(self._recent)
        below_floor = now < self.cfg.floor
        early = mean(self._early) if len(self._early) == self.cfg.baseline_steps else None
        collapsed = (
            early is not None
            and len(self._early) + len(self._recent) > self.cfg.baseline_steps
            and now < self.cfg.min_frac_of_early * early
        )
        if not self._episode.check(below_floor or collapsed):
            return []
        if below_floor or early is None:
            why = f"below the floor {self.cfg.floor:g}"
        else:
            why = f"{now / early:.0%} of its early level {early:.3g}"
        return [
            Alert(
                self.rule,
                step,
                now,
                f"entropy collapsed to {now:.3g} nats/token ({why}): sampling is nearly "
                f"deterministic, groups stop differing and learning stalls. Raise the "
                f"temperature, lower the learning rate, or add beta.",
            )
        ]


class SaturationDetector:
    """Rule ``reward_saturation``: one reward at its maximum while another reward falls."""

    rule = "reward_saturation"

    def __init__(
        self,
        cfg: SaturationRule,
        rearm: int,
        reward_names: Sequence[str],
        reward_max: Mapping[str, float],
    ) -> None:
        self.cfg = cfg
        self._names = list(reward_names)
        self._max = dict(reward_max)
        self._share: dict[str, deque[float]] = {
            n: deque(maxlen=cfg.smooth_steps) for n in self._names
        }
        self._level: dict[str, deque[float]] = {
            n: deque(maxlen=cfg.smooth_steps) for n in self._names
        }
        self._means: dict[str, deque[float]] = {n: deque(maxlen=cfg.window) for n in self._names}
        self._episodes = {n: Episode(rearm) for n in self._names}

    def _saturation(self, name: str) -> tuple[float, str] | None:
        """How saturated a reward is, when known: (share or mean, description)."""
        if len(self._share[name]) == self.cfg.smooth_steps:
            share = mean(self._share[name])
            if share >= self.cfg.saturated_share:
                return share, f"{share:.0%} of completions at its maximum"
            return None
        top = self._max.get(name)
        if top is not None and len(self._level[name]) == self.cfg.smooth_steps:
            level = mean(self._level[name])
            if level >= top - self.cfg.max_tolerance * max(abs(top), 1.0):
                return level, f"mean {level:.3g} at its maximum {top:g}"
        return None

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        if len(self._names) < 2:
            return []
        seen = False
        for n in self._names:
            share = metric(metrics, f"pass_rate/{n}")
            if share is not None:
                self._share[n].append(share)
            level = metric(metrics, f"rewards/{n}/mean")
            if level is not None:
                self._level[n].append(level)
                self._means[n].append(level)
                seen = True
        if not seen:
            return []
        falling: dict[str, tuple[float, float]] = {}
        for n in self._names:
            if len(self._means[n]) < self.cfg.window:
                continue
            corr, first, last = trend(list(self._means[n]))
            if corr <= -self.cfg.min_corr and first - last >= self.cfg.min_drop:
                falling[n] = (first, last)
        alerts: list[Alert] = []
        for n in self._names:
            sat = self._saturation(n)
            others = {m: v for m, v in falling.items() if m != n}
            if not self._episodes[n].check(sat is not None and bool(others)):
                continue
            assert sat is not None
            fell = ", ".join(f"'{m}' {a:.3g} -> {b:.3g}" for m, (a, b) in others.items())
            alerts.append(
                Alert(
                    self.rule,
                    step,
                    sat[0],
                    f"reward '{n}' is saturated ({sat[1]}) while {fell} fell over the last "
                    f"{self.cfg.window} steps: the policy may be serving the easy reward at the "
                    f"other's expense. Gate the easy reward or lower its weight.",
                )
            )
        return alerts


class GroupDominanceDetector:
    """Rule ``group_dominance``: one text taking over a group (smoothed max duplicate share)."""

    rule = "group_dominance"

    def __init__(self, cfg: GroupDominanceRule, rearm: int) -> None:
        self.cfg = cfg
        self._recent: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        dup = metric(metrics, MAX_GROUP_DUPLICATE_FRAC)
        if dup is None:
            return []
        self._recent.append(dup)
        if len(self._recent) < self.cfg.smooth_steps:
            return []
        now = mean(self._recent)
        if not self._episode.check(now >= self.cfg.max_duplicate_frac):
            return []
        return [
            Alert(
                self.rule,
                step,
                now,
                f"one completion text fills {now:.0%} of a group (mean of the last "
                f"{self.cfg.smooth_steps} steps): the policy answers the same way every time, "
                f"so the group gives no learning signal. Check that sample for a memorised answer.",
            )
        ]


class MonitorSet:
    """All enabled detectors of a config, fed one step at a time.

    Args:
        config: thresholds and switches.
        reward_names: the configured reward functions (the ``<name>`` in ``rewards/<name>/mean``).
        reward_max: the maximum of each bounded reward, when known; lets the saturation rule work
            without the ``pass_rate/<name>`` metric.
    """

    def __init__(
        self,
        config: MonitorConfig,
        reward_names: Sequence[str],
        reward_max: Mapping[str, float] | None = None,
    ) -> None:
        rearm = config.rearm_steps
        candidates: list[tuple[bool, Detector]] = [
            (config.length_reward.enabled, LengthRewardDetector(config.length_reward, rearm)),
            (config.repetition.enabled, RepetitionDetector(config.repetition, rearm)),
            (config.kl.enabled, KLDetector(config.kl, rearm)),
            (config.heldout.enabled, HeldoutDetector(config.heldout, rearm, reward_names)),
            (config.entropy.enabled, EntropyDetector(config.entropy, rearm)),
            (
                config.saturation.enabled,
                SaturationDetector(config.saturation, rearm, reward_names, reward_max or {}),
            ),
            (
                config.group_dominance.enabled,
                GroupDominanceDetector(config.group_dominance, rearm),
            ),
        ]
        self.detectors: list[Detector] = [d for on, d in candidates if on] if config.enabled else []

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        """Feed one step's metrics; the alerts that fired at this step, in detector order."""
        alerts: list[Alert] = []
        for detector in self.detectors:
            alerts.extend(detector.update(step, metrics))
        return alerts
