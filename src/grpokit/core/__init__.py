"""Pure math of GRPO, one concern a module: advantages, KL estimators, policy losses,
log-probs and entropy, top-k / top-p truncation, the curriculum's draw, success amplification
(theory, forecast) and statistics.

Nothing here reads files or config objects; every hyperparameter is a keyword argument. Import
from the module (``from grpokit.core.losses import policy_loss``): the package itself imports
nothing, so the modules without torch (theory, forecast, stats) load without it.
"""
