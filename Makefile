# The project's verbs. Each target is a line or two; logic lives in scripts/ or Rust.
SHELL := /bin/bash
CARGO ?= cargo
export SLUICE_MODEL_DIR ?= $(CURDIR)/models/cache
# The peer for `make bench` (../shared/peers/llamacpp_bench.py); measured only when it exists.
LLAMACPP_PY ?= /tmp/llamacpp/bin/python
PEERS ?= $(CURDIR)/../shared/peers

.PHONY: model run test bench bench-engine lint fmt

## Fetch the default model (SmolLM2-135M-Instruct Q4_1) into $(SLUICE_MODEL_DIR), verified.
model:
	@scripts/fetch-model.sh

## Build release and run the default model on a sample chat (the gateway issue makes this a server).
run: model
	$(CARGO) run --release -p sluice-models --example generate -- --model smollm2-135m-instruct \
	  --messages '[{"role": "user", "content": "Explain continuous batching in two sentences."}]'

## Every test, against the real model.
test: model
	$(CARGO) build --workspace --examples
	$(CARGO) test --workspace --all-targets

## Release figures of the forward pass, with ratios to llama.cpp measured in the same run.
bench: model
	@scripts/bench.sh "$(LLAMACPP_PY)" "$(PEERS)"

## Closed-loop load on the engine handle (no HTTP): throughput, TTFT and ITL per concurrency.
bench-engine: model
	$(CARGO) build --release -p sluice-engine --example bench_engine
	target/release/examples/bench_engine --model-dir "$(SLUICE_MODEL_DIR)"

## Formatting and clippy, warnings as errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
