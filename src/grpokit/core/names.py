"""The names a config selects core algorithms by, kept free of torch.

The config is validated before anything heavy is imported, so a mistyped key or value fails in a
fraction of a second, not after seconds of loading torch; its field types therefore live here and
the modules that implement them import these.
"""

from __future__ import annotations

from typing import Literal

MultiObjectiveAggregation = Literal["sum_then_normalize", "normalize_then_sum"]
"""How rewards of several objectives are combined before the group normalisation (see
:mod:`grpokit.core.advantages`)."""

LossTypeName = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]
"""The registered loss types (:data:`grpokit.core.losses.LOSS_TYPES`), for the config's field
type."""

MismatchMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
"""How the importance weight between the trainer's and the rollout engine's log-probs is bounded
(:class:`grpokit.core.losses.MismatchCorrection`)."""
