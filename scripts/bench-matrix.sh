#!/usr/bin/env bash
# `make bench-matrix` (issue #53): gantry-bench on several models rather than one, the chat and
# chat-sampled workloads at 1 and 4 streams, each against the plain and the tuned reference.
#
# The models: the catalogue's MATRIX_MODELS, pulled with `gantry models pull` into
# ~/.cache/gantry/models, and the 1.5B requantized from its Q4_K_M to each of MATRIX_QUANTS with
# the reference build's llama-quantize (`--allow-requantize`; written once beside the pulled
# file as qwen2.5-coder-1.5b-instruct-<quant>.gguf, whose names crates/bench/src/targets.rs
# matches). Requantizing a Q4_K_M loses what Q4_K_M already lost: these files are for speed (the
# kernels Gantry has for Q8_0, Q4_0, Q5_K and IQ4_XS), not for quality.
#
# The models in MATRIX_TRAFFIC (file stems; default the 1.5B as shipped, whose real-traffic
# targets issue #53 sets) also run the `traffic` workload (real ShareGPT conversations, closed
# loop at 1, 4 and 8 streams) when scripts/fetch-traffic-dataset.sh has the dataset.
#
# Each model's report goes to MATRIX_DIR/<file stem>.md (+ .svg, + .json), not docs/benchmarks.md;
# at the end `gantry-bench --matrix-summary` prints the matrix of all of them and writes it to
# MATRIX_DIR/README.md. A full run takes hours on a small machine; BENCH_ARGS are passed on (e.g.
# --passes 1 --requests 4).
#
# Environment (the Makefile sets them): GANTRY_BIN, BENCH_BIN, MATRIX_MODELS, MATRIX_QUANTS,
# MATRIX_DIR, MATRIX_ARGS, MATRIX_TRAFFIC, BENCH_ARGS, GANTRY_NATIVE_CFLAGS.
# MATRIX_MODELS, MATRIX_QUANTS and MATRIX_TRAFFIC set but empty mean none (`make bench-matrix
# MATRIX_MODELS= MATRIX_TRAFFIC= MATRIX_QUANTS=IQ4_XS` runs one requantized model); unset, the
# defaults below.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GANTRY_BIN="${GANTRY_BIN:-target/release/gantry}"
BENCH_BIN="${BENCH_BIN:-target/release/gantry-bench}"
MATRIX_MODELS="${MATRIX_MODELS-qwen2.5-coder-0.5b qwen2.5-coder-1.5b smollm2-135m gemma3-270m}"
MATRIX_QUANTS="${MATRIX_QUANTS-Q8_0 Q4_0 Q5_K_M IQ4_XS}"
MATRIX_DIR="${MATRIX_DIR:-docs/bench-matrix}"
MATRIX_ARGS="${MATRIX_ARGS:---workloads chat,chat-sampled --concurrency 1,4 --sampled-concurrency 1,4}"
MATRIX_TRAFFIC="${MATRIX_TRAFFIC-qwen2.5-coder-1.5b-instruct-q4_k_m}"
log() { echo "[bench-matrix] $*" >&2; }

ref="$("$HERE/build-reference-llama-server.sh")"
traffic_dataset=""
if [ -n "$MATRIX_TRAFFIC" ]; then
  traffic_dataset="$("$HERE/fetch-traffic-dataset.sh")" || log "no traffic dataset: the traffic workload is skipped"
fi
quantize="$(REFERENCE_TOOL=llama-quantize "$HERE/build-reference-llama-server.sh")"

models=()
for name in $MATRIX_MODELS; do
  models+=("$("$GANTRY_BIN" models pull --quiet "$name" | tail -n 1)")
done
# The requantized 1.5B files, each made once.
source_1_5b="$("$GANTRY_BIN" models pull --quiet qwen2.5-coder-1.5b | tail -n 1)"
for quant in $MATRIX_QUANTS; do
  out="$(dirname "$source_1_5b")/qwen2.5-coder-1.5b-instruct-${quant,,}.gguf"
  if [ ! -f "$out" ]; then
    log "requantizing $(basename "$source_1_5b") to $quant"
    "$quantize" --allow-requantize "$source_1_5b" "$out.part" "$quant" >&2
    mv "$out.part" "$out"
  fi
  models+=("$out")
done

mkdir -p "$MATRIX_DIR"
for model in "${models[@]}"; do
  stem="$(basename "$model" .gguf)"
  log "== $stem =="
  # A base model (no chat template in its GGUF's metadata, which comes first in the file) is
  # measured through /v1/completions: both servers refuse chat on it. grep counts (reads all it
  # is given): `grep -q` would stop at the first match, and `head`, cut off, would fail the
  # pipeline under pipefail, taking every model for a base model.
  api=()
  templates="$(head -c 64000000 "$model" | grep -ca tokenizer.chat_template || true)"
  if [ "${templates:-0}" = 0 ]; then api=(--completions); fi
  # --workloads appends: these models run traffic beside MATRIX_ARGS' workloads.
  traffic=()
  if [ -n "$traffic_dataset" ] && [[ " $MATRIX_TRAFFIC " == *" $stem "* ]]; then
    traffic=(--workloads traffic --traffic-dataset "$traffic_dataset" --traffic-concurrency 1,4,8 --traffic-rates 0)
  fi
  # shellcheck disable=SC2086 # MATRIX_ARGS and BENCH_ARGS are lists of flags
  (set -x && "$BENCH_BIN" --gantry-bin "$GANTRY_BIN" --reference-bin "$ref" --model "$model" \
    $MATRIX_ARGS "${api[@]}" "${traffic[@]}" --out "$MATRIX_DIR/$stem.md" --chart "$MATRIX_DIR/$stem.svg" \
    --json "$MATRIX_DIR/$stem.json" ${BENCH_ARGS:-})
done
"$BENCH_BIN" --matrix-summary "$MATRIX_DIR"
log "reports in $MATRIX_DIR/"
