"""The best checkpoint by a held-out metric, and early stopping on it (transformers' semantics).

Three things are recorded in the :class:`~grpokit.train.checkpoint.TrainerState`, so that a
resumed run goes on exactly:

- ``best_metric`` / ``best_global_step``: the best value of training.metric_for_best_model over
  every periodic eval (transformers' ``_determine_best_metric``);
- ``early_stopping_patience_counter``: evals in a row that did not improve on the best value by
  more than early_stopping_threshold (transformers' ``EarlyStoppingCallback``: the new value is
  compared with the best *before* it is recorded, and a smaller improvement still becomes the
  best);
- ``best_model_checkpoint``: of the checkpoints written at an eval step, the one whose eval was
  best. transformers names the checkpoint at ``best_global_step`` when that step was saved and
  keeps an older one otherwise; choosing among the saved evals instead gives the best checkpoint
  there is even where saves and evals do not line up.

A NaN value (every held-out reward None) is never an improvement.
"""

from __future__ import annotations

import math

from grpokit.train.checkpoint import TrainerState


def is_better(value: float, best: float | None, *, greater: bool) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing recorded yet). NaN never does."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best if greater else value < best


def record_eval(
    state: TrainerState, step: int, value: float, *, greater: bool, threshold: float = 0.0
) -> bool:
    """Record the eval of ``step``: the early-stopping counter, then the best value. Returns
    whether it is a new best."""
    improved = is_better(value, state.best_metric, greater=greater) and (
        state.best_metric is None or abs(value - state.best_metric) > threshold
    )
    state.early_stopping_patience_counter = (
        0 if improved else state.early_stopping_patience_counter + 1
    )
    if not is_better(value, state.best_metric, greater=greater):
        return False
    state.best_metric, state.best_global_step = value, step
    return True


def record_checkpoint(
    state: TrainerState, step: int, value: float | None, *, greater: bool
) -> bool:
    """A checkpoint of ``step`` is being written; ``value`` is the eval of that same step (None:
    no eval there). Returns whether it becomes the best checkpoint."""
    if value is None or not is_better(value, state.best_model_checkpoint_metric, greater=greater):
        return False
    state.best_model_checkpoint = f"checkpoint-{step}"
    state.best_model_checkpoint_metric = value
    return True


def stops_early(state: TrainerState, patience: int | None) -> bool:
    """Whether ``patience`` evals in a row have not improved."""
    return patience is not None and state.early_stopping_patience_counter >= patience
