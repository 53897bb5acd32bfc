# The two commands of README.md. Each sets up what it needs first (scripts/setup.sh, one level
# each, idempotent): `make demo` only what the demo needs, `make test` the rest as well.
export GRPOKIT_VENV ?= .venv
.PHONY: setup setup-demo demo test test-slow lint bench

setup-demo:
	bash scripts/setup.sh demo

setup:
	bash scripts/setup.sh test

demo: setup-demo
	$(GRPOKIT_VENV)/bin/grpokit demo

test: setup
	bash scripts/test.sh

test-slow: setup
	bash scripts/test.sh --slow

lint: setup
	bash scripts/test.sh --lint-only
