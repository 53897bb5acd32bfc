"""Generation engines behind one interface (:class:`grpokit.rollout.base.RolloutEngine`): the
torch engine, vLLM, an engine generating ahead, and multi-turn rollouts with tools.

The package itself imports nothing, so a command's ``--help`` that reaches a light module here
does not load torch.
"""
