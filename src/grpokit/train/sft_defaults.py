"""The defaults of ``grpokit sft``, apart from the code that trains so that the command's
``--help`` reads them without importing torch."""

DEFAULT_STEPS = 16
"""Few on purpose: a long SFT makes sampling deterministic and GRPO's groups equal."""
DEFAULT_LR_FULL = 2e-5
DEFAULT_LR_LORA = 2e-4
