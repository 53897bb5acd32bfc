"""grpokit: post-train language models with GRPO from one YAML config."""

__version__ = "0.1.0"
