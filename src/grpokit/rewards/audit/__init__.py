"""Checking a reward before training on it, on a file of the user's own completions.

- :mod:`.check`: ``grpokit rewards check``, every configured reward's score per completion;
- :mod:`.judge`: ``grpokit judge audit``, an LLM judge's noise, agreement and exploitability;
- :mod:`.reward_model`: ``grpokit judge audit-reward-model``, a reward model's length bias,
  repeat noise and exploitability;
- :mod:`.common` (reading the completions file, picking the reward entry, printing figures) and
  :mod:`.planted` (bad answers built from the user's prompts), which they share.
"""
