"""A local judge endpoint: llama.cpp's own OpenAI-compatible server on a GGUF file (by default the
embedded SmolLM2-135M-Instruct), through xllamacpp (an optional dependency).

    python -m grpokit.rewards.judge.local_server [--model F.gguf] [--alias smollm2] [--port P]
        [--host 127.0.0.1] [--ctx 2048] [--threads N]

It prints ``listening on http://HOST:PORT/v1`` once it answers and serves until SIGTERM or
SIGINT. ``scripts/judge_server.sh`` and the judge tests start it. xllamacpp ships llama.cpp's
server (the C++ ``llama-server``: chat completions, ``logprobs`` with ``top_logprobs``, the
``grammar`` request field) compiled into a prebuilt wheel, so nothing is built at install; the
server answers one request at a time (one slot), as the judge tests expect of it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

XLLAMACPP_REQUIREMENT = "xllamacpp>=2026.10.11549"
"""The versions whose parameter names this module uses (``scripts/setup.sh`` pins one)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grpokit.rewards.judge.local_server",
        description="llama.cpp's OpenAI-compatible server on a GGUF file (xllamacpp).",
    )
    parser.add_argument("--model", help="the GGUF file (default: the embedded SmolLM2 model)")
    parser.add_argument("--alias", default="smollm2", help="the model name requests use")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx", type=int, default=2048, help="context length")
    parser.add_argument(
        "--threads", type=int, default=1, help="threads, for generating and reading prompts"
    )
    return parser


def serve(args: argparse.Namespace) -> Any:
    """Start the server described by ``args`` (see :func:`_parser`); returns xllamacpp's Server,
    which serves from its own threads while it is referenced."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    return xllamacpp.Server(params)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.model is None:
        from grpokit.model_files.embedded import find_embedded_gguf

        try:
            args.model = str(find_embedded_gguf())
        except Exception as exc:  # the embedded model's package is missing or damaged
            print(f"no --model, and the embedded model: {exc}", file=sys.stderr)
            return 2
    try:
        import xllamacpp  # noqa: F401
    except ImportError:
        print(
            f"llama.cpp's server comes with xllamacpp (prebuilt wheels); install it "
            f"(pip install '{XLLAMACPP_REQUIREMENT}')",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    try:
        server = serve(args)
    except Exception as exc:  # llama.cpp's own message: a bad file, a port in use ...
        print(f"the server did not start: {exc}", file=sys.stderr)
        return 1
    print(f"listening on {server.listening_address}/v1", flush=True)
    stop.wait()
    # xllamacpp's server threads are not joined at interpreter exit: leave at once, as the
    # server would on SIGTERM.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
