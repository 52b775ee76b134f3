# Gantry: `make serve` to run it, `make test` to check it.
SHELL := /bin/bash
.DEFAULT_GOAL := serve

CARGO ?= cargo
MODEL ?= qwen2.5-coder-0.5b
HOST ?= 127.0.0.1
PORT ?= 8080
RELEASE_BIN := target/release/gantry
DEBUG_BIN := target/debug/gantry
VENV ?= $(HOME)/.cache/gantry/venv
E2E_MODELS ?= qwen2.5-coder-0.5b qwen2.5-coder-1.5b
BENCH_MODEL ?= qwen2.5-coder-0.5b
# Extra gantry-bench flags, e.g. BENCH_ARGS="--concurrency 1,4 --requests 8 --servers gantry".
BENCH_ARGS ?=

.PHONY: serve build deps test test-rust test-e2e models-e2e bench clean

deps:
	@scripts/install-build-deps.sh

build: deps
	$(CARGO) build --release -p gantry-server

serve: build
	$(RELEASE_BIN) models pull $(MODEL)
	$(RELEASE_BIN) serve --model $(MODEL) --host $(HOST) --port $(PORT)

# Builds the same package set as `cargo test --workspace`, so features unify once and llama.cpp
# compiles once.
test: deps
	$(CARGO) build --workspace --all-targets
	$(MAKE) test-rust
	$(MAKE) test-e2e

# The accounts suite and the replica tests also run against a throwaway PostgreSQL on loopback
# (installed from Debian's packages when missing). GANTRY_REQUIRE_POSTGRES turns a missing
# database into failing tests instead of skipped ones.
test-rust:
	url="$$(scripts/test-postgres.sh)" && GANTRY_TEST_DATABASE_URL="$$url" GANTRY_REQUIRE_POSTGRES=1 $(CARGO) test --workspace --no-fail-fast

models-e2e:
	@for m in $(E2E_MODELS); do $(DEBUG_BIN) models pull --quiet $$m >/dev/null || exit 1; done

test-e2e: models-e2e
	@scripts/python-venv.sh >/dev/null
	GANTRY_BIN=$(CURDIR)/$(DEBUG_BIN) $(VENV)/bin/python -m pytest -q tests/e2e

# Gantry vs a reference llama-server built from source (cached in ~/.cache/gantry/reference), same
# GGUF, one server at a time; prints ratios and writes docs/benchmarks.md + docs/bench-chart.svg.
bench: deps
	$(CARGO) build --release -p gantry-server -p gantry-bench
	@ref="$$(scripts/build-reference-llama-server.sh)" && \
	model="$$($(RELEASE_BIN) models pull --quiet $(BENCH_MODEL) | tail -n 1)" && \
	set -x && target/release/gantry-bench --gantry-bin $(RELEASE_BIN) --reference-bin "$$ref" --model "$$model" $(BENCH_ARGS)

clean:
	$(CARGO) clean
