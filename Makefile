# The two commands of README.md. Each sets up a fresh machine first (idempotent, cached).
.PHONY: setup demo test test-slow lint bench

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/grpokit demo

test: setup
	bash scripts/test.sh

test-slow: setup
	bash scripts/test.sh --slow

lint: setup
	bash scripts/test.sh --lint-only
