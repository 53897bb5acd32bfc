"""Decoding steps replayed from a CUDA graph.

On a GPU a decoding step of a small model costs what the host spends launching its kernels, not
what the GPU computes: on an H200 one step of a 30-layer, 135M-parameter Llama at 32 rows
launched 1,219 kernels and took 28.5 ms of wall time for 2.65 ms of GPU work; the same step
replayed as a CUDA graph took 3.18 ms (bench/RESULTS.md, "First run on an H200"). vLLM captures its decoding
steps the same way. :class:`GraphedSteps` captures the static decoder's fixed-shape step
(:meth:`StaticLlamaDecoder.fixed_step`) once per rollout, at its first step, and replays it for
every later token; the sampling between steps stays outside the graph.

Not yet on by default (``TorchEngine(cuda_graphs=...)``): the capture has been timed on a GPU only
for a single step, and bench/gpu_check.sh compares whole rollouts with it on and off.
"""

from __future__ import annotations

import torch

from grpokit.native.decoders import StaticLlamaDecoder


class GraphedSteps:
    """A rollout's decoding steps, as a callable ``token (rows,) -> logits (rows, V)`` that
    stands in for ``decoder.step``; the decoder's :attr:`reference_logits` follow each step.

    Args:
        decoder: a static decoder after its prefill and expansion; its rows stay as they are
            (:meth:`StaticLlamaDecoder.select` cannot be called while its steps are graphed).
        capture: capture the step as a CUDA graph (the decoder on a CUDA device); False runs
            the same fixed-shape step uncaptured, anywhere (what the CPU tests check).
    """

    def __init__(self, decoder: StaticLlamaDecoder, *, capture: bool) -> None:
        self.decoder = decoder
        self.capture = capture
        self.graph: torch.cuda.CUDAGraph | None = None
        self.token: torch.Tensor | None = None  # the graph's input: each step's tokens go here
        self.logits: torch.Tensor | None = None  # the graph's outputs, rewritten by each replay
        self.reference_logits: torch.Tensor | None = None

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        decoder = self.decoder
        if self.token is None:
            decoder.begin_fixed_steps()
            self.token = token.clone()
            if self.capture:
                self._capture()
        self.token.copy_(token)
        if self.graph is None:
            logits = decoder.fixed_step(self.token)
        else:
            self.graph.replay()
            assert self.logits is not None
            # Copies: the next replay rewrites the graph's own output buffers.
            logits = self.logits.clone()
            if self.reference_logits is not None:
                decoder.reference_logits = self.reference_logits.clone()
        decoder.column += 1
        return logits

    def _capture(self) -> None:
        """Record one fixed step into :attr:`graph`, after warm-up steps on a side stream (as
        PyTorch asks, so that lazy initialisations happen outside the capture) whose advance of
        the column and positions is undone; their cache writes land in the column the first
        replay then writes again. Capturing runs nothing: the first replay is the first step."""
        decoder = self.decoder
        assert self.token is not None
        column, positions = decoder.column_index.clone(), decoder.next_position.clone()
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                decoder.fixed_step(self.token)
                decoder.column_index.copy_(column)
                decoder.next_position.copy_(positions)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = decoder.fixed_step(self.token)
        self.reference_logits = decoder.reference_logits if decoder.reference else None
