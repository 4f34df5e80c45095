# The project's verbs. Each target is a line or two; logic lives in scripts/ or Rust.
SHELL := /bin/bash
CARGO ?= cargo
export SLUICE_MODEL_DIR ?= $(CURDIR)/models/cache
# The peer for `make bench` (../shared/peers/llamacpp_bench.py); measured only when it exists.
LLAMACPP_PY ?= /tmp/llamacpp/bin/python
PEERS ?= $(CURDIR)/../shared/peers

.PHONY: model run release test bench bench-kernels bench-engine bench-loadtest bench-gateway simulate lint fmt \
	check-deploy check-cuda check-gpu check-gpu-dry

## Fetch the default model (SmolLM2-135M-Instruct Q4_1) into $(SLUICE_MODEL_DIR), verified.
model:
	@scripts/fetch-model.sh

## Build release and serve the default model's OpenAI API on 127.0.0.1:8080.
run: model
	$(CARGO) run --release -p sluice-gateway --bin sluice -- serve --host 127.0.0.1 --port 8080 \
	  --model smollm2-135m-instruct --model-dir "$(SLUICE_MODEL_DIR)"

## The release binaries the images ship, `sluice` and `sluice-autoscaler`
## (FEATURES=sluice-gateway/cuda for candle's CUDA backend).
release:
	$(CARGO) build --locked --release -p sluice-gateway --bin sluice \
	  -p sluice-autoscaler --bin sluice-autoscaler $(if $(FEATURES),--features $(FEATURES))

## Every test, against the real model: Rust tests (the autoscaler's Prometheus source against
## a real Prometheus, fetched into target/prometheus), then the `openai` client and schemathesis
## against the real binary (pinned into target/pyvenv). The HTTP tests and the `openai` client
## run a second time on the candle backend (`--backend candle`, on the CPU). Examples are built
## (and linted), not rebuilt as test harnesses: they hold no tests.
test: model
	scripts/fetch-prometheus.sh
	$(CARGO) build --workspace --examples --bins
	scripts/check-deploy.sh
	$(CARGO) test --workspace --lib --bins --tests
	SLUICE_TEST_BACKEND=candle $(CARGO) test --workspace --test http
	SLUICE_CUDA_GRAPHS=1 SLUICE_TEST_BACKEND=candle $(CARGO) test --workspace --test http
	scripts/python-tests.sh
	SLUICE_TEST_BACKEND=candle SLUICE_PYTEST_ONLY=1 scripts/python-tests.sh

## Release figures of the forward pass, with ratios to llama.cpp measured in the same run.
bench: model
	@scripts/bench.sh "$(LLAMACPP_PY)" "$(PEERS)"

## Each quantized matrix kernel alone (cache-resident operands): GMAC/s per thread by batch rows.
bench-kernels:
	$(CARGO) run --release -p sluice-models --example kernels

## Closed-loop load on the engine handle (no HTTP): throughput, TTFT and ITL per concurrency.
bench-engine: model
	$(CARGO) build --release -p sluice-engine --example bench_engine
	target/release/examples/bench_engine --model-dir "$(SLUICE_MODEL_DIR)"

## The load tester's own ceiling: req/s against a fake answering at once, timing cost per chunk.
bench-loadtest:
	$(CARGO) run --release -p sluice-loadtest --example self_bench

## Every autoscaling policy over the Azure conversation trace, default scenario (release).
simulate:
	$(CARGO) run --release -p sluice-autoscaler -- simulate --trace ../shared/data/traces/azure-llm-2023-conv.csv

## The routing gateway's cost: req/s and added latency in front of a fake that answers at
## once, against the fake alone and SGLang's router when target/sglang-venv has it.
bench-gateway:
	$(CARGO) build --release -p sluice-gateway --bin sluice --example bench_gateway
	target/release/examples/bench_gateway --sluice target/release/sluice

## deploy/: render every kustomize overlay, validate each object (Kubernetes schemas, the
## ServingPool CRD) and check the manifests against the binaries (--check-config, probes, ports).
check-deploy:
	$(CARGO) build -p sluice-gateway -p sluice-autoscaler --bins
	scripts/check-deploy.sh

## Build `sluice` with --features cuda, nvcc from PyPI's CUDA wheels (slow; not in CI).
check-cuda:
	scripts/check-cuda.sh

## On an NVIDIA machine (no Rust needed): runs what check-cuda put in target/gpu-carry, writes
## check-gpu.json (scripts/check-gpu.sh says what it measures).
check-gpu:
	scripts/check-gpu.sh

## The same script on this machine's CPU, tiny shapes (a few minutes): tests it without a GPU.
check-gpu-dry:
	$(CARGO) build -p sluice-models --example gpucheck --example synth -p sluice-gateway --bin sluice
	rm -rf target/gpu-carry-dry && mkdir -p target/gpu-carry-dry/bin target/gpu-carry-dry/models
	cp target/debug/examples/gpucheck target/debug/examples/synth target/debug/sluice \
	  target/gpu-carry-dry/bin/
	target/debug/examples/synth --truncate-from $${SLUICE_MODEL_DIR:-models/cache}/SmolLM2-135M-Instruct.Q4_1.gguf \
	  --layers 4 --out target/gpu-carry-dry/models/smollm2-4l.gguf
	SLUICE_GPU_DRY=1 SLUICE_GPU_DEVICE=cpu SLUICE_GPU_BACKEND=kernels \
	  SLUICE_GPU_OUT=target/gpu-carry-dry/check-gpu.json scripts/check-gpu.sh target/gpu-carry-dry

## Formatting and clippy, warnings as errors.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
