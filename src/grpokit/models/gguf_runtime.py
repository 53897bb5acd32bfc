"""llama.cpp inside this process, for a GGUF file grpokit wrote: its tokenizer, the logits of every
prompt position, greedy decoding, and llama.cpp's own quantiser.

``grpokit export --check`` runs a GGUF export greedily beside the checkpoint, ``--quantize
q4_k_m|q5_k_m|q6_k`` calls llama.cpp's quantiser, and the export tests compare a file's tokens
and logits with PyTorch's. All of that goes through cyllama (an optional dependency), whose
Cython bindings of llama.cpp's C API PyPI serves as prebuilt wheels (the CPU build, AVX2 and
no wider, glibc 2.17), so nothing is compiled at install. ``scripts/setup.sh test`` installs
the version pinned below; llama-cpp-python, which PyPI serves for Linux only as a source build
(about 7 minutes on 2 cores), is no longer needed.

cyllama 0.2.x (the last series with wheels for Python 3.10 and 3.11) reads the vocabulary size
for its logit getters from an attribute the model object lacks; :class:`GGUFModel` loads the
model through a subclass that has it.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from grpokit.errors import UserError

CYLLAMA_REQUIREMENT = "cyllama>=0.2.18,<0.3"
"""The versions whose API this module uses (``scripts/setup.sh`` pins one of them)."""

INSTALL_HINT = f"pip install '{CYLLAMA_REQUIREMENT}'"

# ggml's log levels (enum ggml_log_level): CONT continues the previous message.
LOG_WARN, LOG_ERROR, LOG_CONT = 2, 3, 5
_GGML_TYPE_F32 = 0
_FLASH_ATTN_DISABLED = 0  # enum llama_flash_attn_type


def available() -> bool:
    """Whether llama.cpp can run in-process here (cyllama imports)."""
    try:
        import cyllama  # noqa: F401
    except ImportError:
        return False
    return True


def require_cyllama(what: str) -> Any:
    """cyllama's llama.cpp module, or :class:`UserError` saying that ``what`` needs it and how to
    install it."""
    try:
        import cyllama.llama.llama_cpp as cy
    except ImportError as exc:
        raise UserError(
            f"{what} runs llama.cpp inside grpokit, which comes with cyllama (prebuilt wheels); "
            f"install it ({INSTALL_HINT})"
        ) from exc
    _route_log(cy)
    return cy


class _Log:
    """Where llama.cpp's log goes: nowhere, except into the list of a :func:`kept_log` block
    (warnings and errors, with their continuation lines)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sink: list[str] | None = None
        self.keep = False

    def __call__(self, level: int, text: str) -> None:
        if level != LOG_CONT:
            self.keep = level in (LOG_WARN, LOG_ERROR)
        sink = self.sink
        if sink is not None and self.keep and text:
            sink.append(text)


_LOG = _Log()
_routed = False


def _route_log(cy: Any) -> None:
    """Send llama.cpp's log to :data:`_LOG` (once): quiet by default, as llama.cpp would
    otherwise print every load to stderr."""
    global _routed
    if not _routed:
        cy.set_log_callback(_LOG)
        # Models still open at exit are freed after this module's globals are gone: llama.cpp's
        # log of that would call into a half-torn-down object.
        atexit.register(cy.disable_logging)
        _routed = True


@contextlib.contextmanager
def kept_log() -> Iterator[list[str]]:
    """Collect llama.cpp's warnings and errors while the block runs (one block at a time)."""
    kept: list[str] = []
    with _LOG.lock:
        _LOG.sink, _LOG.keep = kept, False
        try:
            yield kept
        finally:
            _LOG.sink = None


def log_lines(kept: Sequence[str]) -> list[str]:
    """The non-empty lines of a :func:`kept_log` list."""
    return [line.strip() for line in "".join(kept).splitlines() if line.strip()]


def quantize(source: Path, target: Path, file_type: int) -> tuple[bool, list[str]]:
    """Run llama.cpp's quantiser on ``source`` into ``target`` as ``file_type`` (llama.h's enum
    llama_ftype, e.g. 15 for Q4_K_M). Returns whether it succeeded and llama.cpp's warnings and
    errors, one a line (a tensor stored in another type says so there)."""
    cy = require_cyllama("quantising a GGUF file")
    params = cy.LlamaModelQuantizeParams()
    params.ftype = int(file_type)
    with kept_log() as kept:
        try:
            cy.model_quantize(str(source), str(target), params)
            done = True
        except RuntimeError as exc:
            kept.append(f"{exc}\n")
            done = False
    return done, log_lines(kept)


class GGUFModel:
    """One GGUF file loaded by llama.cpp, with a context of ``n_ctx`` tokens for one sequence.

    Args:
        path: the file.
        n_ctx: context length (prompt and generated tokens together).
        n_threads: threads for decoding and for reading prompts.
        f32_cache: keep the KV cache in float32 rather than llama.cpp's float16, so that an f32
            file is compared with PyTorch at full precision (random tiny models have near ties
            that float16 rounding flips).
    """

    def __init__(
        self, path: Path | str, *, n_ctx: int = 512, n_threads: int = 1, f32_cache: bool = False
    ) -> None:
        cy = require_cyllama("running a GGUF file")

        class _Model(cy.LlamaModel):  # type: ignore[misc,name-defined]
            # cyllama 0.2.x's get_logits/get_logits_ith read ``model.n_vocab``, which its
            # LlamaModel lacks (the vocabulary has it).
            @property
            def n_vocab(self) -> int:
                return int(self.get_vocab().n_vocab)

        self.path = Path(path)
        with kept_log() as kept:
            try:
                self._model = _Model(str(path), cy.LlamaModelParams(), verbose=False)
            except (ValueError, RuntimeError) as exc:
                detail = "; ".join(log_lines(kept)[-3:]) or str(exc)
                raise UserError(f"{path}: llama.cpp could not load the file: {detail}") from exc
            params = cy.LlamaContextParams()
            params.n_ctx = n_ctx
            params.n_batch = n_ctx
            params.n_threads = n_threads
            params.n_threads_batch = n_threads
            # llama.cpp's default (auto) takes flash attention on CPU, which rounds the queries
            # to float16: logits then differ from PyTorch's by up to a few tenths. Without it
            # they are the ones llama-cpp-python gave (measured identical on the embedded model).
            params.flash_attn_type = _FLASH_ATTN_DISABLED
            if f32_cache:
                params.type_k = _GGML_TYPE_F32
                params.type_v = _GGML_TYPE_F32
            self._ctx = cy.LlamaContext(self._model, params, verbose=False)
        self._cy = cy
        self._vocab = self._model.get_vocab()
        self.n_ctx = n_ctx
        self.n_vocab: int = int(self._vocab.n_vocab)
        self.metadata: dict[str, str] = dict(self._model.metadata())

    # ---- the tokenizer --------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        """llama.cpp's tokens of ``text``: a BOS first when ``add_bos`` and the file says its
        tokenizer adds one; ``special`` reads special tokens' text as those tokens."""
        return [int(t) for t in self._vocab.tokenize(text, add_bos, special)]

    @property
    def token_bos(self) -> int:
        return int(self._vocab.token_bos())

    @property
    def adds_bos(self) -> bool:
        """Does the file's tokenizer put a BOS before a prompt (``tokenizer.ggml.add_bos_token``)?"""
        return self.metadata.get("tokenizer.ggml.add_bos_token") == "true"

    def token_text(self, token: int) -> str:
        """A token's text, special tokens included."""
        return str(self._vocab.token_to_piece(token, special=True))

    def is_end(self, token: int) -> bool:
        """Does ``token`` end generation (EOS, EOT and the like, as the file marks them)?"""
        return bool(self._vocab.is_eog(token))

    # ---- running it -----------------------------------------------------------------------------

    def _decode(self, tokens: Sequence[int], start: int, *, rows_from: int | None = None) -> None:
        """Decode ``tokens`` at positions ``start``...; logits are kept for the last token and,
        where ``rows_from`` is given, for every token from that index of ``tokens`` on."""
        if start + len(tokens) > self.n_ctx:
            raise UserError(
                f"{self.path}: {start + len(tokens)} tokens do not fit the context of {self.n_ctx}"
            )
        batch = self._cy.LlamaBatch(n_tokens=max(1, len(tokens)), embd=0, n_seq_max=1)
        last = len(tokens) - 1
        for i, token in enumerate(tokens):
            keep = i == last or (rows_from is not None and i >= rows_from)
            batch.add(int(token), start + i, [0], keep)
        self._ctx.decode(batch)

    def logits(self, ids: Sequence[int], *, first: int = 0) -> list[list[float]]:
        """The logits after each of ``ids`` from index ``first`` on (one row per position,
        ``n_vocab`` long), read as one prompt from an empty cache. A row is a vocabulary of
        Python floats, so a caller that needs few rows asks only for those."""
        self._ctx.kv_cache_clear()
        self._decode(ids, 0, rows_from=first)
        return [list(self._ctx.get_logits_ith(i)) for i in range(first, len(ids))]

    def greedy(self, ids: Sequence[int], n: int, *, stop_at_end: bool = False) -> list[int]:
        """Up to ``n`` tokens after the prompt ``ids``, each the most likely (the first on ties),
        from an empty cache; ``stop_at_end`` stops before an end-of-generation token."""
        self._ctx.kv_cache_clear()
        out: list[int] = []
        if n <= 0:
            return out
        self._decode(ids, 0)
        while True:
            row = self._ctx.get_logits_ith(-1)
            token = int(row.index(max(row)))
            if stop_at_end and self.is_end(token):
                return out
            out.append(token)
            if len(out) == n:
                return out
            self._decode([token], len(ids) + len(out) - 1)

    def close(self) -> None:
        for part in ("_ctx", "_model"):
            handle = self.__dict__.pop(part, None)
            if handle is not None:
                handle.close()

    def __enter__(self) -> GGUFModel:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
