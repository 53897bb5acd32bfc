"""Reward-hacking detectors over the stream of per-step metrics.

Each detector sees one step's metrics at a time (the dict the trainer writes to metrics.jsonl,
including the text metrics of :func:`grpokit.monitor.text_stats.text_stats`) and returns the
alerts that fired at that step. An alert fires once per episode: when its condition turns true,
not again while it stays true, and again only after it has been false for ``rearm_steps``
consecutive checks. A step that lacks a detector's metrics is not a check.

Per-step metrics are noisy (a step sees a few prompts), so a rule about a change fires only when
the change is both large enough to matter (the rule's own thresholds) and beyond the noise: a
one-sided t test of the shift between two windows against the metric's step-to-step noise
(:func:`grpokit.monitor.series.shift`), at a per-check level that keeps the chance of any false
alarm on a healthy run under ``monitors.false_alarm_rate`` (``series.ChangeTest``). Its episode
then lasts while the change stays large. Rules about a level (kl_high, the entropy floor,
saturation, group_dominance) compare a smoothed value with a fixed threshold; the two about
groups that stop differing (the entropy rule, group_dominance) also need enough groups stalled
rather than solved (``StalledGroups``). Every message states its evidence.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Protocol

from grpokit.monitor.config import (
    DivergenceRule,
    EntropyRule,
    GroupDominanceRule,
    HeldoutRule,
    KLRule,
    LengthRewardRule,
    MonitorConfig,
    RepetitionRule,
    SaturationRule,
)
from grpokit.monitor.series import ChangeTest, Shift, mean, median, metric, shift, trend
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


def _before(buffer: Sequence[float], after: int) -> list[float]:
    """The values of a buffer that precede its last ``after`` (the noise before a change)."""
    return list(buffer)[: len(buffer) - after]


class Episode:
    """Fire once when a condition turns true; re-arm after it has been false ``rearm`` times."""

    def __init__(self, rearm: int) -> None:
        self._rearm = rearm
        self._armed = True
        self._false_run = 0

    def check(self, condition: bool, holding: bool | None = None) -> bool:
        """Record one check; True when this check starts a new episode.

        ``holding`` (default: the condition) keeps a started episode going: a change rule fires
        when the change is large and significant, and its episode lasts while the change stays
        large, since the change itself soon enters the noise estimate and weakens the test.
        """
        if self._armed:
            if condition:
                self._armed = False
                self._false_run = 0
                return True
            return False
        if condition or bool(holding):
            self._false_run = 0
        else:
            self._false_run += 1
            if self._false_run >= self._rearm:
                self._armed = True
        return False


def _halves(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """A window split into its earlier and later half (the later one gets an odd middle value)."""
    half = len(values) // 2
    return list(values[:half]), list(values[half:])


def _steps(points: Sequence[tuple[int, float]]) -> str:
    """'steps 1-5 -> 6-10': the two halves of a window of (step, value) points."""
    a, b = _halves([float(p[0]) for p in points])
    return f"steps {a[0]:.0f}-{a[-1]:.0f} -> {b[0]:.0f}-{b[-1]:.0f}"


class LengthRewardDetector:
    """Rule ``length_reward``: mean completion length growing while the reward rises.

    Over the last ``window`` steps: the later half's mean length is at least ``min_rel_growth``
    above the earlier half's and that rise passes the noise test; both length and reward have a
    Spearman correlation with the step of at least ``min_corr`` (a trend, not one odd step).
    """

    rule = "length_reward"

    def __init__(self, cfg: LengthRewardRule, rearm: int, test: ChangeTest | None = None) -> None:
        self.cfg = cfg
        self.test = test or ChangeTest.of()
        self._points: deque[tuple[int, float, float]] = deque(maxlen=cfg.window)
        self._lengths = self.test.buffer(cfg.window)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        length = metric(metrics, "completions/mean_length")
        reward = metric(metrics, "reward")
        if length is None or reward is None:
            return []
        self._points.append((step, length, reward))
        self._lengths.append(length)
        if len(self._points) < self.cfg.window:
            return []
        lengths, rewards = [p[1] for p in self._points], [p[2] for p in self._points]
        first, last = (mean(h) for h in _halves(lengths))
        growth = (last - first) / max(first, 1.0)
        # The cheap test first: most steps of most runs stop here.
        corr_len = corr_rew = 0.0
        if growth >= self.cfg.min_rel_growth:
            corr_len, corr_rew = trend(lengths), trend(rewards)
        large = (
            growth >= self.cfg.min_rel_growth
            and corr_len >= self.cfg.min_corr
            and corr_rew >= self.cfg.min_corr
        )
        # The noise of the steps before the window: a change inside it cannot inflate it.
        grew = shift(*_halves(lengths), _before(self._lengths, self.cfg.window)) if large else None
        fired = self._episode.check(large and self.test.rose(grew), large)
        if not fired or grew is None:
            return []
        rew_first, rew_last = (mean(h) for h in _halves(rewards))
        return [
            Alert(
                self.rule,
                step,
                growth,
                f"completion length grew {growth:.0%} ({grew.before:.0f} -> {grew.after:.0f} "
                f"tokens, {_steps([p[:2] for p in self._points])}; {self.test.evidence(grew)}) "
                f"while the reward rose ({rew_first:.3g} -> {rew_last:.3g}; Spearman length "
                f"{corr_len:.2f}, reward {corr_rew:.2f}). Check whether the reward pays for "
                f"length rather than quality.",
            )
        ]


class RepetitionDetector:
    """Rule ``repetition``: repeated n-grams above, or distinct bigrams below, the early level.

    The mean of the last ``smooth_steps`` steps against the mean of the first ``baseline_steps``:
    the change must reach the rule's threshold and pass the noise test.
    """

    rule = "repetition"

    def __init__(self, cfg: RepetitionRule, rearm: int, test: ChangeTest | None = None) -> None:
        self.cfg = cfg
        self.test = (test or ChangeTest.of()).split(2)  # repeated n-grams and distinct-2
        self._early_rep: list[float] = []
        self._early_d2: list[float] = []
        self._recent_rep: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._recent_d2: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._noise_rep = self.test.buffer(cfg.smooth_steps)
        self._noise_d2 = self.test.buffer(cfg.smooth_steps)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        rep = metric(metrics, REPEATED_NGRAM_FRAC)
        d2 = metric(metrics, DISTINCT_2)
        if rep is None and d2 is None:
            return []
        in_baseline = False
        for value, early, recent, noise in (
            (rep, self._early_rep, self._recent_rep, self._noise_rep),
            (d2, self._early_d2, self._recent_d2, self._noise_d2),
        ):
            if value is None:
                continue
            recent.append(value)
            noise.append(value)
            if len(early) < self.cfg.baseline_steps:
                early.append(value)
                in_baseline = True
        if in_baseline:
            return []
        reasons: list[tuple[float, str]] = []
        large = False
        if rep is not None and self._early_rep:
            prior = _before(self._noise_rep, len(self._recent_rep))
            s = shift(self._early_rep, list(self._recent_rep), prior)
            rose = s is not None and s.diff >= self.cfg.max_increase
            large |= rose
            if s is not None and rose and self.test.rose(s):
                why = f"repeated n-gram share rose from {s.before:.2f} to {s.after:.2f}"
                reasons.append((s.after, f"{why} ({self.test.evidence(s)})"))
        if d2 is not None and self._early_d2:
            prior = _before(self._noise_d2, len(self._recent_d2))
            s = shift(self._early_d2, list(self._recent_d2), prior)
            fell = s is not None and s.after < self.cfg.min_distinct_ratio * s.before
            large |= fell
            if s is not None and fell and self.test.fell(s):
                why = f"distinct-2 fell from {s.before:.2f} to {s.after:.2f}"
                reasons.append((s.after, f"{why} ({self.test.evidence(s)})"))
        if not self._episode.check(bool(reasons), large):
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
    """Rules ``kl_high`` (kl above a ceiling) and ``kl_jump`` (kl a multiple of its recent median).

    A jump must hold for ``jump_persist_steps`` consecutive steps and stand out of the noise: those
    steps' KL against the mean of the ``jump_window`` steps before them passes the noise test.
    """

    rule = "kl_high"
    jump_rule = "kl_jump"

    def __init__(self, cfg: KLRule, rearm: int, test: ChangeTest | None = None) -> None:
        self.cfg = cfg
        self.test = test or ChangeTest.of()
        self._series: deque[float] = deque(
            maxlen=max(self.test.noise_window, cfg.jump_window) + cfg.jump_persist_steps
        )
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
        self._series.append(kl)
        values = list(self._series)
        persist = self.cfg.jump_persist_steps
        # The steps before the tested ones: their median is the reference, their scatter the
        # noise (the jump itself must not widen it).
        recent, earlier = values[-persist:], values[:-persist]
        history = earlier[-self.cfg.jump_window :]
        if len(recent) == persist and len(history) >= self.cfg.jump_min_history:
            low = min(recent)
            # The floor keeps a near-zero median (KL starts at 0) from making any value a jump.
            ref = max(median(history), self.cfg.jump_min / self.cfg.jump_ratio)
            ratio = low / ref
            s = shift(history, recent, earlier[-self.test.noise_window :])
            jumped = low >= self.cfg.jump_min and ratio >= self.cfg.jump_ratio
            if self._jump.check(jumped and self.test.rose(s), jumped) and s is not None:
                held = (
                    f" and stayed at {low:.3g} or more for {persist} steps" if persist > 1 else ""
                )
                alerts.append(
                    Alert(
                        self.jump_rule,
                        step,
                        kl,
                        f"KL jumped to {kl:.3g}{held}, {ratio:.1f}x its median "
                        f"{median(history):.3g} over the previous {len(history)} steps "
                        f"({self.test.evidence(s)}). A sudden policy change: look at the "
                        f"samples of these steps.",
                    )
                )
        return alerts


class HeldoutDetector:
    """Rule ``heldout_divergence``: training reward up since the held-out eval's best, eval down.

    Pairs ``rewards/<name>/mean`` with ``eval/<name>/mean`` for each reward, and the total
    ``reward`` with ``eval/reward`` (or ``eval/reward/mean``) when a total eval reward is logged.
    A reward in ``watch`` (usually one of weight 0: a quality signal logged, not trained on) is
    also paired with the total training reward: what the run optimises rising while the held-out
    quality falls.
    Evals are few, so their noise cannot be read off their series: when the eval logs the
    standard error of its mean (``eval/<name>/stderr``, ``eval/reward/stderr``), the drop from the
    best eval must also pass a one-sided z test at the per-check level divided by the number of
    earlier evals (the best was picked among them); without it the thresholds decide alone, and
    the message says so.
    """

    rule = "heldout_divergence"

    def __init__(
        self,
        cfg: HeldoutRule,
        rearm: int,
        reward_names: Sequence[str],
        test: ChangeTest | None = None,
    ) -> None:
        self.cfg = cfg
        self.test = test or ChangeTest.of()
        self._pairs = [(f"rewards/{n}/mean", f"eval/{n}/mean", n) for n in reward_names]
        self._pairs.append(("reward", "eval/reward", "total reward"))
        self._pairs += [
            ("reward", f"eval/{n}/mean", f"{n} (watched) against the total reward")
            for n in cfg.watch
        ]
        self._train: dict[str, deque[float]] = {
            t: deque(maxlen=cfg.smooth_steps) for t, _, _ in self._pairs
        }
        self._train_at: dict[str, dict[int, float]] = {t: {} for t in self._train}
        self._evals: dict[str, list[tuple[int, float, float | None]]] = {
            e: [] for _, e, _ in self._pairs
        }
        self._episodes = {(t, e): Episode(rearm) for t, e, _ in self._pairs}

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        for train_key, recent in self._train.items():
            train = metric(metrics, train_key)
            if train is not None:
                recent.append(train)
            if recent:
                self._train_at[train_key][step] = mean(recent)
        evaluated = set()
        for eval_key, history in self._evals.items():
            value = metric(metrics, eval_key)
            if value is None and eval_key == "eval/reward":
                value = metric(metrics, "eval/reward/mean")
            if value is not None:
                err_key = eval_key.removesuffix("/mean") + "/stderr"
                history.append((step, value, metric(metrics, err_key)))
                evaluated.add(eval_key)
        alerts: list[Alert] = []
        for train_key, eval_key, label in self._pairs:
            if eval_key in evaluated:
                alert = self._check(step, train_key, eval_key, label)
                if alert is not None:
                    alerts.append(alert)
        return alerts

    def _check(self, step: int, train_key: str, eval_key: str, label: str) -> Alert | None:
        """The pair's check at an eval step: the latest eval against the best earlier one."""
        history = self._evals[eval_key]
        train_now = self._train_at[train_key].get(step)
        if len(history) < 2 or train_now is None:
            return None
        peak_step, peak, peak_se = max(history[:-1], key=lambda p: p[1])
        train_then = self._train_at[train_key].get(peak_step)
        if train_then is None:
            return None
        value = history[-1][1]
        drop, rise = peak - value, train_now - train_then
        large = drop >= self.cfg.min_eval_drop and rise >= self.cfg.min_train_rise
        err_key = eval_key.removesuffix("/mean") + "/stderr"
        passes, evidence = self._drop_test(
            drop, (peak_se, history[-1][2]), len(history) - 1, err_key
        )
        if not self._episodes[train_key, eval_key].check(large and passes, large):
            return None
        return Alert(
            self.rule,
            step,
            drop,
            f"{label}: held-out mean fell from {peak:.3g} (step {peak_step}) to "
            f"{value:.3g} ({evidence}) while the training reward rose from "
            f"{train_then:.3g} to {train_now:.3g}. The policy is learning what the "
            f"training prompts reward, not the task: compare samples, consider an "
            f"earlier checkpoint.",
        )

    def _drop_test(
        self,
        drop: float,
        errors: tuple[float | None, float | None],
        candidates: int,
        err_key: str,
    ) -> tuple[bool, str]:
        """Whether the drop from the best of ``candidates`` evals passes the z test, in words."""
        if errors[0] is None or errors[1] is None:
            return True, f"no {err_key} logged, so the drop is not tested against eval noise"
        z_bar = NormalDist().inv_cdf(1.0 - self.test.alpha / candidates)
        se = math.hypot(errors[0], errors[1])
        z = drop / se if se > 0 else (math.inf if drop > 0 else 0.0)
        return z >= z_bar, (
            f"z = {z:.1f} against the evals' standard errors, beyond {z_bar:.1f} "
            f"({self.test.false_alarm_rate:.2g} false alarms per {self.test.horizon_steps} steps)"
        )


class DivergenceDetector:
    """Rule ``reward_divergence``: a watched reward falls on the training batches while the total
    training reward rises.

    The watched rewards (``monitors.heldout.watch``) are quality signals logged with weight 0:
    the policy is not trained on them, so their fall while the trained reward climbs is the
    hack itself. Per step they are means over the whole batch, so the check runs every step:
    the later half of the last ``window`` steps against the steps before it (up to
    ``noise_window``), both changes large enough and beyond their step-to-step noise (the fall
    test shared among the watched rewards).
    """

    rule = "reward_divergence"

    def __init__(
        self,
        cfg: DivergenceRule,
        rearm: int,
        watched: Sequence[str],
        test: ChangeTest | None = None,
    ) -> None:
        self.cfg = cfg
        self._watched = list(watched)
        self.test = (test or ChangeTest.of()).split(len(self._watched))
        self._after = cfg.window - cfg.window // 2
        self._total = self.test.buffer(self._after)
        self._values = {n: self.test.buffer(self._after) for n in self._watched}
        self._episodes = {n: Episode(rearm) for n in self._watched}

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        total = metric(metrics, "reward")
        if total is None or not self._watched:
            return []
        self._total.append(total)
        rose = self._shift(list(self._total))
        alerts: list[Alert] = []
        for name in self._watched:
            value = metric(metrics, f"rewards/{name}/mean")
            if value is None:
                continue
            self._values[name].append(value)
            fell = self._shift(list(self._values[name]))
            if fell is None or rose is None:
                continue
            large = -fell.diff >= self.cfg.min_drop and rose.diff >= self.cfg.min_rise
            significant = self.test.fell(fell) and self.test.rose(rose)
            if not self._episodes[name].check(large and significant, large):
                continue
            alerts.append(
                Alert(
                    self.rule,
                    step,
                    fell.after,
                    f"'{name}' (watched) fell from {fell.before:.3g} to {fell.after:.3g} over the "
                    f"last {self._after} steps ({self.test.evidence(fell)}) while the training "
                    f"reward rose from {rose.before:.3g} to {rose.after:.3g} "
                    f"({self.test.evidence(rose)}). The policy is gaming the trained reward: "
                    f"read the samples, consider an earlier checkpoint and a guarded reward.",
                )
            )
        return alerts

    def _shift(self, values: list[float]) -> Shift | None:
        if len(values) < self.cfg.window:
            return None
        before, after = values[: -self._after], values[-self._after :]
        return shift(before, after, before)


class StalledGroups:
    """The smoothed share of groups that give no learning signal without being solved.

    Solved groups (every completion at every reward's maximum) have zero std too, but identical
    right answers are what training aims at; the level rules about groups that stop differing
    (entropy, group_dominance) fire only while enough groups are stalled. None while the metric
    ``frac_reward_solved`` is absent (a reward without a maximum): the rule then decides alone.
    """

    def __init__(self, smooth_steps: int, min_frac: float) -> None:
        self.min_frac = min_frac
        self._recent: deque[float] = deque(maxlen=smooth_steps)

    def update(self, metrics: Mapping[str, object]) -> None:
        zero_std = metric(metrics, "frac_reward_zero_std")
        solved = metric(metrics, "frac_reward_solved")
        if zero_std is not None and solved is not None:
            self._recent.append(max(0.0, zero_std - solved))

    @property
    def share(self) -> float | None:
        return mean(self._recent) if self._recent else None

    def stalled(self) -> bool:
        share = self.share
        return share is None or share >= self.min_frac

    def evidence(self) -> str:
        share = self.share
        return "" if share is None else f"; {share:.0%} of groups give no signal unsolved"


class EntropyDetector:
    """Rule ``entropy_collapse``: smoothed entropy below a floor or a fraction of its early level.

    The fall against the early level (the first ``baseline_steps``) must also pass the noise
    test; the floor is an absolute level.
    """

    rule = "entropy_collapse"

    def __init__(self, cfg: EntropyRule, rearm: int, test: ChangeTest | None = None) -> None:
        self.cfg = cfg
        self.test = test or ChangeTest.of()
        self._early: list[float] = []
        self._recent: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._noise = self.test.buffer(cfg.smooth_steps)
        self._stalled = StalledGroups(cfg.smooth_steps, cfg.min_stalled_frac)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        self._stalled.update(metrics)
        entropy = metric(metrics, "entropy")
        if entropy is None:
            return []
        self._recent.append(entropy)
        self._noise.append(entropy)
        if len(self._early) < self.cfg.baseline_steps:
            self._early.append(entropy)
        now = mean(self._recent)
        below_floor = now < self.cfg.floor
        fell = (
            shift(self._early, list(self._recent), _before(self._noise, len(self._recent)))
            if len(self._early) == self.cfg.baseline_steps
            else None
        )
        large = (
            fell is not None
            and len(self._early) + len(self._recent) > self.cfg.baseline_steps
            and now < self.cfg.min_frac_of_early * fell.before
        )
        collapsed = large and self.test.fell(fell)
        stalled = self._stalled.stalled()
        if not self._episode.check(
            stalled and (below_floor or collapsed), stalled and (below_floor or large)
        ):
            return []
        if below_floor or fell is None:
            why = f"below the floor {self.cfg.floor:g}"
        else:
            why = (
                f"{now / fell.before:.0%} of its early level {fell.before:.3g}; "
                f"{self.test.evidence(fell)}"
            )
        # The setting that counters a collapse directly is the entropy bonus; its adaptive form
        # needs a target, and the run's own early entropy is the one to aim for.
        target = mean(self._early) if self._early else self.cfg.floor
        return [
            Alert(
                self.rule,
                step,
                now,
                f"entropy collapsed to {now:.3g} nats/token ({why}"
                f"{self._stalled.evidence()}): sampling is nearly "
                f"deterministic, groups stop differing and learning stalls. Counter it with an "
                f"entropy bonus: training.use_adaptive_entropy: true with entropy_target: "
                f"{target:.2g} (the early level) and entropy_coef: 0.005, or a fixed "
                f"entropy_coef such as 0.001; or raise the temperature, lower the learning "
                f"rate, or add beta.",
            )
        ]


class SaturationDetector:
    """Rule ``reward_saturation``: one reward at its maximum while another reward falls.

    Falling: the mean of the later half of the last ``window`` steps is at least ``min_drop``
    below the mean of the steps before it (up to ``noise_window`` of them: a long reference makes
    the test see a fall sooner through noisy per-step rewards), that fall passes the noise test,
    and the reward's Spearman correlation with the step over the window is at most ``-min_corr``.
    """

    rule = "reward_saturation"

    def __init__(
        self,
        cfg: SaturationRule,
        rearm: int,
        reward_names: Sequence[str],
        reward_max: Mapping[str, float],
        test: ChangeTest | None = None,
    ) -> None:
        self.cfg = cfg
        self._names = list(reward_names)
        self.test = (test or ChangeTest.of()).split(len(self._names))  # a fall test per reward
        self._max = dict(reward_max)
        self._share: dict[str, deque[float]] = {
            n: deque(maxlen=cfg.smooth_steps) for n in self._names
        }
        self._level: dict[str, deque[float]] = {
            n: deque(maxlen=cfg.smooth_steps) for n in self._names
        }
        self._after = cfg.window - cfg.window // 2
        self._means: dict[str, deque[tuple[int, float]]] = {
            n: deque(maxlen=self.test.noise_window + self._after) for n in self._names
        }
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
                self._means[n].append((step, level))
                seen = True
        if not seen:
            return []
        falling = {n: f for n in self._names if (f := self._falling(n)) is not None}
        alerts: list[Alert] = []
        for n in self._names:
            sat = self._saturation(n)
            large = {m: v for m, v in falling.items() if m != n}
            others = {m: s for m, (s, significant) in large.items() if significant}
            fired = self._episodes[n].check(
                sat is not None and bool(others), sat is not None and bool(large)
            )
            if not fired or sat is None:
                continue
            fell = "; ".join(
                f"'{m}' {s.before:.3g} -> {s.after:.3g} ({self._steps(m)}; {self.test.evidence(s)})"
                for m, s in others.items()
            )
            alerts.append(
                Alert(
                    self.rule,
                    step,
                    sat[0],
                    f"reward '{n}' is saturated ({sat[1]}) while another fell: {fell}. The "
                    f"policy may be serving the easy reward at the other's expense. Gate the "
                    f"easy reward or lower its weight.",
                )
            )
        return alerts

    def _falling(self, name: str) -> tuple[Shift, bool] | None:
        """A reward's fall when it is large, and whether it is significant."""
        values = [p[1] for p in self._means[name]]
        if len(values) < self.cfg.window:
            return None
        before, after = values[: -self._after], values[-self._after :]
        if mean(before) - mean(after) < self.cfg.min_drop:
            return None
        window = values[-self.cfg.window :]
        if trend(window) > -self.cfg.min_corr:
            return None
        s = shift(before, after, before)
        return (s, self.test.fell(s)) if s is not None else None

    def _steps(self, name: str) -> str:
        """The steps of the reference and of the recent window: 'steps 3-30 -> 31-40'."""
        steps = [p[0] for p in self._means[name]]
        before, after = steps[: -self._after], steps[-self._after :]
        return f"steps {before[0]}-{before[-1]} -> {after[0]}-{after[-1]}"


class GroupDominanceDetector:
    """Rule ``group_dominance``: one text taking over a group (smoothed max duplicate share)."""

    rule = "group_dominance"

    def __init__(self, cfg: GroupDominanceRule, rearm: int) -> None:
        self.cfg = cfg
        self._recent: deque[float] = deque(maxlen=cfg.smooth_steps)
        self._stalled = StalledGroups(cfg.smooth_steps, cfg.min_stalled_frac)
        self._episode = Episode(rearm)

    def update(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        self._stalled.update(metrics)
        dup = metric(metrics, MAX_GROUP_DUPLICATE_FRAC)
        if dup is None:
            return []
        self._recent.append(dup)
        if len(self._recent) < self.cfg.smooth_steps:
            return []
        now = mean(self._recent)
        if not self._episode.check(now >= self.cfg.max_duplicate_frac and self._stalled.stalled()):
            return []
        return [
            Alert(
                self.rule,
                step,
                now,
                f"one completion text fills {now:.0%} of a group (mean of the last "
                f"{self.cfg.smooth_steps} steps{self._stalled.evidence()}): the policy answers "
                f"the same way every time, "
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
        test = ChangeTest.of(config)
        candidates: list[tuple[bool, Detector]] = [
            (
                config.length_reward.enabled,
                LengthRewardDetector(config.length_reward, rearm, test),
            ),
            (config.repetition.enabled, RepetitionDetector(config.repetition, rearm, test)),
            (config.kl.enabled, KLDetector(config.kl, rearm, test)),
            (
                config.heldout.enabled,
                HeldoutDetector(config.heldout, rearm, reward_names, test),
            ),
            (
                config.divergence.enabled,
                DivergenceDetector(config.divergence, rearm, config.heldout.watch, test),
            ),
            (config.entropy.enabled, EntropyDetector(config.entropy, rearm, test)),
            (
                config.saturation.enabled,
                SaturationDetector(config.saturation, rearm, reward_names, reward_max or {}, test),
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
