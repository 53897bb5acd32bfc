"""Reward-hacking monitors: text metrics of completions and detectors over the metric stream."""

from __future__ import annotations

from grpokit.monitor.config import MonitorConfig
from grpokit.monitor.detectors import Alert, Detector, MonitorSet
from grpokit.monitor.text_stats import text_stats, tokenize

__all__ = ["Alert", "Detector", "MonitorConfig", "MonitorSet", "text_stats", "tokenize"]
