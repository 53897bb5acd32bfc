"""Tiny randomly initialised Llama models with the real SmolLM2 tokenizer, for fast tests and
benchmarks of the machinery (not of learning): they load and run in well under a second. The same
builder makes Qwen2 models (attention biases) and models of real sizes, in bfloat16 and on a GPU,
for benchmarks of real shapes. Small tokenizers of other families (Llama 3, Qwen2, ...) are built
here too, for tests of what depends on the tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from grpokit.hub.embedded import embedded_model_dir

TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
"""The default shape: 2 layers of width 64 (about 3.3M parameters, nearly all the embedding)."""


MODEL_TYPES = ("llama", "qwen2")
"""The architectures :func:`make_tiny_model_dir` builds (transformers' ``model_type``)."""


def make_tiny_model_dir(
    out_dir: str | Path,
    *,
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
    model_type: str = "llama",
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    **config_overrides: Any,
) -> Path:
    """Save a randomly initialised causal LM (``LlamaForCausalLM`` by default) plus a tokenizer
    to ``out_dir``.

    Args:
        out_dir: directory to write (created).
        seed: seed of the weight initialisation; the same seed gives the same weights on the same
            device.
        tokenizer_dir: where the tokenizer (and chat template) comes from; default the embedded
            SmolLM2 model (converted on first use). Its vocabulary size sets the model's.
        model_type: one of :data:`MODEL_TYPES`; ``qwen2`` is Qwen2's architecture (biases on the
            attention's query, key and value projections).
        dtype: of the saved weights; default float32. Initialising in the saved dtype keeps a
            model of billions of parameters from needing a float32 copy first.
        device: where the weights are initialised; default the CPU. A GPU initialises billions
            of parameters in about a second, where the CPU takes a minute or more.
        config_overrides: config fields (LlamaConfig's, Qwen2Config's) replacing
            :data:`TINY_CONFIG`'s.

    Returns:
        ``out_dir`` as a Path.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes: dict[str, tuple[Any, Any]] = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }
    if model_type not in classes:
        raise ValueError(f"unknown model_type {model_type!r}; one of {', '.join(MODEL_TYPES)}")
    config_class, model_class = classes[model_type]
    return _save_tiny(
        model_class,
        out_dir,
        seed,
        tokenizer_dir,
        config_overrides,
        config_class=config_class,
        dtype=dtype,
        device=device,
    )


def make_tiny_classifier_dir(
    out_dir: str | Path,
    *,
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
    num_labels: int = 1,
    **config_overrides: Any,
) -> Path:
    """Save a randomly initialised ``LlamaForSequenceClassification`` (a reward model's shape:
    one logit per text, read at its last non-pad token) plus a tokenizer to ``out_dir``.

    The same arguments as :func:`make_tiny_model_dir`; ``num_labels`` logits per text. The
    config's ``pad_token_id`` is set, so batches of several texts can be scored.
    """
    from transformers import LlamaForSequenceClassification

    overrides = {"num_labels": num_labels, "tie_word_embeddings": False, **config_overrides}
    return _save_tiny(LlamaForSequenceClassification, out_dir, seed, tokenizer_dir, overrides)


def _save_tiny(
    model_class: Any,
    out_dir: str | Path,
    seed: int,
    tokenizer_dir: str | Path | None,
    config_overrides: dict[str, Any],
    config_class: Any = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> Path:
    from transformers import AutoTokenizer, LlamaConfig

    from grpokit.hub.resolve import pad_token_id

    config_class = config_class or LlamaConfig
    where = torch.device(device if device is not None else "cpu")
    out = Path(out_dir)
    source = Path(tokenizer_dir) if tokenizer_dir is not None else embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    eos_id = tokenizer.eos_token_id
    pad_id = pad_token_id(tokenizer)
    settings: dict[str, Any] = {
        **TINY_CONFIG,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        **config_overrides,
    }
    config = config_class(**settings)
    # Fork the RNG so building a model does not change the caller's random stream.
    gpus = [where.index if where.index is not None else 0] if where.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus):
        torch.manual_seed(seed)
        with where, _default_dtype(dtype or torch.get_default_dtype()):
            model = model_class(config)
    if model.can_generate():
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = pad_id
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to ``dtype`` inside, restored after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


TOKENIZER_FAMILIES = ("llama3", "qwen2", "smollm", "gpt2", "tekken")
"""Byte-level BPE tokenizer families :func:`make_tiny_tokenizer_dir` builds: the pre-tokenizer (how
text is cut before BPE) and BPE settings of Llama 3, Qwen2, SmolLM, GPT-2 and Mistral Nemo
(Tekken), each with a small vocabulary trained here."""

# Sentences for the tiny vocabularies: words, contractions, numbers of every length, code,
# punctuation runs, several kinds of whitespace and a few non-ASCII scripts, so that each family's
# way of cutting text leaves its mark on the merges it learns.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!",
    "I've been told he's there, but I'll check. We're sure they'd like some tea, aren't we?",
    "What is 17 + 25? It is 42. What is 123 * 4567? It is 560741. 3.14 and 2.718 are famous.",
    "In 2024 there were 1000000 visitors, 365 days a year, 24 hours a day, 60 minutes an hour.",
    "Rivers flow into the sea. Mountains rise above the valleys, and rain falls on the fields.",
    "Name three colours: red, green and blue. Name two more: yellow and purple.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
    "HelloWorld and CamelCaseWords mix UPPER and lower case; HTTPServer handles JSONData.",
    "Wait... really?! Yes!!! No??? Maybe --- or ==== or ''' or ``` or \"\"\" quotes.",
    "Line one\nLine two\n\nLine four after a blank line\r\nWindows line end.   Spaces   between.",
    "Le café est très bon. Die Straße ist lang. Привет, как дела? 我想在苹果工作。",
    "<answer>42</answer> <think>Let me add 17 and 25 step by step.</think>",
    "Write one sentence about rivers. Write another sentence about the ocean and its waves.",
]

# Chat templates (Jinja, as in tokenizer_config.json): ChatML for most families, Llama 3's headers.
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_LLAMA3_CHAT = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Mistral Nemo's pre-tokenizer pattern, as its tokenizer.json has it (Tekken: words split at
# lower-to-upper case changes, single digits).
_TEKKEN_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _family_pipeline(family: str) -> tuple[Any, Any, bool]:
    """(normaliser, pre-tokenizer, BPE ignore_merges) of a family, taken from transformers' own
    definitions where it has them."""
    from tokenizers import Regex, pre_tokenizers

    if family == "qwen2":
        from transformers import Qwen2Tokenizer

        backend = Qwen2Tokenizer().backend_tokenizer
        return backend.normalizer, backend.pre_tokenizer, False
    if family == "gpt2":
        from transformers import GPT2Tokenizer

        return None, GPT2Tokenizer().backend_tokenizer.pre_tokenizer, False
    if family == "llama3":
        # Llama 3's tokenizer.json came from its tiktoken file through this converter, whose
        # default pattern and ignore_merges are Llama 3's.
        import inspect

        from transformers.convert_slow_tokenizer import TikTokenConverter

        pattern = inspect.signature(TikTokenConverter.__init__).parameters["pattern"].default
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return None, pre_tokenizers.Sequence([split, byte_level]), True
    if family == "smollm":
        digits = pre_tokenizers.Digits(individual_digits=True)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        return None, pre_tokenizers.Sequence([digits, byte_level]), False
    if family == "tekken":
        split = pre_tokenizers.Split(Regex(_TEKKEN_PATTERN), behavior="isolated", invert=False)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return None, pre_tokenizers.Sequence([split, byte_level]), True
    raise ValueError(f"unknown tokenizer family {family!r}; one of {', '.join(TOKENIZER_FAMILIES)}")


def make_tiny_tokenizer_dir(out_dir: str | Path, family: str, *, vocab_size: int = 640) -> Path:
    """Save a small byte-level BPE tokenizer of one of :data:`TOKENIZER_FAMILIES` to ``out_dir``.

    The vocabulary is trained here on a few sentences (all 256 bytes plus merges, at most
    ``vocab_size`` tokens), so any text encodes; the pre-tokenizer, normaliser, BPE settings,
    special tokens and chat template are the family's, so the same text gives different tokens in
    different families. ``qwen2`` is saved as transformers'
    ``Qwen2Tokenizer`` (as Qwen checkpoints are), the others as a plain ``tokenizer.json``.
    Pass the directory as ``tokenizer_dir`` to :func:`make_tiny_model_dir`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer, ignore_merges = _family_pipeline(family)
    if family == "llama3":
        bos, eos, pad = "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>"
        specials = [bos, pad, "<|start_header_id|>", "<|end_header_id|>", eos]
    else:
        bos, eos, pad = None, "<|im_end|>", "<|endoftext|>"
        specials = [pad, "<|im_start|>", eos]
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    # The vocabulary is learnt on text cut only before spaces, so it holds tokens spanning
    # digits, punctuation and case changes, as large real vocabularies do; the family's own
    # cutting, set afterwards, decides which of them text is encoded with.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?\S+|\s+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer=trainer)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast: Any
    if family == "qwen2":
        from transformers import Qwen2Tokenizer

        model = json.loads(tokenizer.to_str())["model"]
        # tokenizers' BPE takes merges as pairs (transformers' annotation says strings).
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        fast = Qwen2Tokenizer(
            vocab=model["vocab"],
            merges=merges,  # type: ignore[arg-type]
            eos_token=eos,
            pad_token=pad,
        )
    else:
        if bos is not None:
            bos_id = tokenizer.token_to_id(bos)
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
            )
        fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=tokenizer, bos_token=bos, eos_token=eos, pad_token=pad
        )
    fast.chat_template = _LLAMA3_CHAT if family == "llama3" else _CHATML
    fast.save_pretrained(out)
    return out


SENTENCEPIECE_FAMILIES = ("gemma", "llama2")
"""SentencePiece-style tokenizer families :func:`make_tiny_sentencepiece_tokenizer_dir` builds:
Gemma's (no "▁" prepended to the text) and Llama 2's (prepended, as Phi-3 and Mistral 7B)."""

_GEMMA_CHAT = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_LLAMA2_CHAT = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST] "
    "{{ message['content'] }} [/INST]{% else %} {{ message['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)


def _sentencepiece_merges(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, in the order of the token they make (as
    transformers writes the merges of a tokenizer converted from SentencePiece)."""
    merges = []
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((vocab[left], vocab[right], index, left, right))
    merges.sort(key=lambda m: (m[2], m[0], m[1]))
    return [(left, right) for _, _, _, left, right in merges]


def make_tiny_sentencepiece_tokenizer_dir(
    out_dir: str | Path, family: str, *, vocab_size: int = 640
) -> Path:
    """Save a small SentencePiece-style BPE tokenizer (byte fallback, spaces as "▁") of one of
    :data:`SENTENCEPIECE_FAMILIES` to ``out_dir``.

    As in a tokenizer converted from a SentencePiece model: the special tokens and the 256 byte
    tokens ``<0x00>``..``<0xFF>`` come first, then the characters and pieces learnt here on a few
    sentences (pieces start at a "▁", as SentencePiece's do), with every split of a piece into
    two pieces as a merge. ``gemma`` is saved as transformers' ``GemmaTokenizer``; ``llama2`` as
    Llama 2's own tokenizer.json has it (a normaliser that prepends "▁" to every piece of text
    between special tokens and replaces spaces).
    """
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import GemmaTokenizer, PreTrainedTokenizerFast

    if family not in SENTENCEPIECE_FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(SENTENCEPIECE_FAMILIES)}")
    if family == "gemma":
        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    else:
        specials = ["<unk>", "<s>", "</s>"]
    learner = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    learner.train_from_iterator(
        _CORPUS, trainer=trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False)
    )
    learnt = sorted(learner.get_vocab().items(), key=lambda item: item[1])
    vocab: dict[str, int] = {}
    for token in [*specials, *(f"<0x{b:02X}>" for b in range(256)), *(t for t, _ in learnt)]:
        vocab.setdefault(token, len(vocab))
    merges = _sentencepiece_merges(vocab)
    fast: Any
    if family == "gemma":
        fast = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)  # type: ignore[arg-type]
        fast.add_special_tokens({"additional_special_tokens": specials[4:]})
        fast.chat_template = _GEMMA_CHAT
    else:
        tokenizer = Tokenizer(
            models.BPE(
                vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True
            )  # fmt: skip
        )
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
        tokenizer.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]  # fmt: skip
        )
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
        )
        fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
            tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
        )
        fast.chat_template = _LLAMA2_CHAT
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out
