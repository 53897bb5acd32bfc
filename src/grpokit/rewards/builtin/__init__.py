"""The built-in reward types, one module per family; each registers its types (the YAML ``type:``
names) when imported, and :mod:`grpokit.rewards.registry` imports them on the first lookup.

- :mod:`.format`: ``xml_format``, ``tags_present``
- :mod:`.match`: ``regex_match``, ``json_schema``
- :mod:`.math_answer`: ``math_answer``
- :mod:`.code_tests`: ``code_tests`` (runs code in :mod:`grpokit.rewards.sandbox`)
- :mod:`.length`: ``length_penalty``, ``soft_overlong_punishment``, ``repetition_penalty``
- :mod:`.logic_tree`: ``logic_tree_depth``, ``logic_tree_quality``
- :mod:`.python_fn`: ``python`` (a function of the user's own)
- :mod:`.reward_model`: ``reward_model`` (a trained sequence classifier)
- :mod:`.checklist`: ``checklist`` (weighted pass/fail items: programs and yes/no judge questions)

The LLM judge (``judge``) has its own package, :mod:`grpokit.rewards.judge`.
"""
