# The two commands of README.md. Each sets up what it needs first (scripts/setup.sh, one level
# each, idempotent): `make demo` only what the demo needs, `make test` the rest as well.
export GRPOKIT_VENV ?= .venv
.PHONY: setup setup-demo setup-models setup-vllm demo test test-slow test-vllm lint bench

setup-demo:
	bash scripts/setup.sh demo

setup:
	bash scripts/setup.sh test

demo: setup-demo
	$(GRPOKIT_VENV)/bin/grpokit demo

test: setup
	bash scripts/test.sh

# The slow tests include the real-model ones, which need the named offline models (the 1.5B only
# as the business-ideas recipe's judge, from its GGUF: it is joined, not converted).
SLOW_TEST_MODELS = qwen2.5-coder-0.5b-instruct gemma-3-270m qwen2.5-coder-1.5b-instruct
test-slow: setup
	bash scripts/setup.sh models $(SLOW_TEST_MODELS)
	bash scripts/test.sh --slow

# The named offline models (Qwen2.5-Coder 0.5B and 1.5B Instruct, Gemma 3 270M; docs/usage.md).
setup-models:
	bash scripts/setup.sh models

# vLLM's CPU build in its own environment (.venv-vllm; it pins transformers), then the tests that
# run a real vLLM engine (docs/vllm.md).
setup-vllm:
	bash scripts/setup.sh vllm

test-vllm: setup-vllm
	bash scripts/test.sh --vllm

lint: setup
	bash scripts/test.sh --lint-only
