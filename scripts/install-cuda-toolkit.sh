#!/usr/bin/env bash
# Prints the root of a CUDA toolkit to build Gantry's `cuda` feature with (CUDA_PATH), installing
# one from NVIDIA's packages on PyPI when none is at hand.
#
# An installed toolkit wins: $CUDA_PATH when it holds bin/nvcc, else the directory of the `nvcc`
# on the PATH. Otherwise the wheels of one CUDA major version (nvcc, the runtime, cuBLAS, CCCL,
# the CRT headers and NVVM: about 570 MB) are downloaded with their sha256 checked against PyPI's,
# and unpacked into ~/.cache/gantry/cuda/<version>, where they form the usual layout (bin/nvcc,
# include/, lib/, nvvm/). The links CMake's FindCUDAToolkit expects are added (lib64, the
# unversioned libcudart.so / libcublas.so / libcublasLt.so). The wheels hold no libcuda.so (the
# driver's), so builds against this toolkit use GGML_CUDA_NO_VMM (llama.cpp's memory pool without
# the driver API's virtual memory; see the Makefile's build-gpu), and shared cuBLAS (the wheels
# hold no static cuBLAS).
#
# Environment: CUDA_WHEEL_VERSION (default below: the nvcc/runtime/CRT/NVVM release; cuBLAS and
# CCCL take their newest release of the same major version), GANTRY_CACHE (default
# ~/.cache/gantry), PYPI_URL (default https://pypi.org), GANTRY_CUDA_FROM_PYPI=1 ignores an
# installed toolkit.
set -euo pipefail

VERSION="${CUDA_WHEEL_VERSION:-13.5.37}"
MAJOR="${VERSION%%.*}"
PYPI_URL="${PYPI_URL:-https://pypi.org}"
CACHE="${GANTRY_CACHE:-$HOME/.cache/gantry}/cuda"
log() { echo "[cuda-toolkit] $*" >&2; }

if [ "${GANTRY_CUDA_FROM_PYPI:-0}" != 1 ]; then
  if [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ]; then
    echo "$CUDA_PATH"
    exit 0
  fi
  if nvcc="$(command -v nvcc 2>/dev/null)"; then
    dirname "$(dirname "$(readlink -f "$nvcc")")"
    exit 0
  fi
fi

ROOT="$CACHE/$VERSION"
TOOLKIT="$ROOT/nvidia/cu$MAJOR"
if [ -x "$TOOLKIT/bin/nvcc" ] && [ -f "$ROOT/.complete" ]; then
  echo "$TOOLKIT"
  exit 0
fi
for tool in curl python3 unzip sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing $tool (try scripts/install-build-deps.sh)"; exit 1; }
done

# package name, and the version to take ("same": $VERSION; "major": newest of that major version).
PACKAGES=(
  "nvidia-cuda-nvcc same"
  "nvidia-cuda-runtime same"
  "nvidia-cuda-crt same"
  "nvidia-nvvm same"
  "nvidia-cublas major"
  "nvidia-cuda-cccl major"
)
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS" "$ROOT"
for entry in "${PACKAGES[@]}"; do
  read -r name pick <<<"$entry"
  index="$PYPI_URL/pypi/$name/json"
  # The manylinux x86_64 wheel of the chosen release, and its sha256.
  read -r url sha file < <(curl -fsSL "$index" | python3 -c '
import json, sys, urllib.parse
index, pick, version, major = sys.argv[1:5]
releases = json.load(sys.stdin)["releases"]
def wheel(v):
    for f in releases.get(v) or []:
        if f["packagetype"] == "bdist_wheel" and "manylinux" in f["filename"] and "x86_64" in f["filename"]:
            return f
if pick == "same":
    chosen = version
else:
    def key(v):
        return [int(p) if p.isdigit() else 0 for p in v.split(".")]
    mine = [v for v in releases if v.split(".")[0] == major and wheel(v)]
    chosen = max(mine, key=key) if mine else None
f = wheel(chosen) if chosen else None
if not f:
    sys.exit(f"no manylinux x86_64 wheel of {index} for CUDA {version}")
print(urllib.parse.urljoin(index, f["url"]), f["digests"]["sha256"], f["filename"])
' "$index" "$pick" "$VERSION" "$MAJOR")
  if [ ! -f "$WHEELS/$file" ] || ! echo "$sha  $WHEELS/$file" | sha256sum -c --quiet >/dev/null 2>&1; then
    log "downloading $file"
    curl -fsSL -o "$WHEELS/$file.part" "$url"
    mv "$WHEELS/$file.part" "$WHEELS/$file"
  fi
  echo "$sha  $WHEELS/$file" | sha256sum -c --quiet || { log "sha256 mismatch for $file"; exit 1; }
  unzip -qo "$WHEELS/$file" 'nvidia/*' -d "$ROOT"
done

[ -x "$TOOLKIT/bin/nvcc" ] || { log "the wheels did not give $TOOLKIT/bin/nvcc"; exit 1; }
# What CMake's FindCUDAToolkit and the linker look for in a toolkit root.
ln -sfn lib "$TOOLKIT/lib64"
for lib in cudart cublas cublasLt; do
  so="$(cd "$TOOLKIT/lib" && ls "lib$lib.so."* 2>/dev/null | sort | head -n 1)"
  [ -n "$so" ] || { log "lib$lib.so.* missing from the wheels"; exit 1; }
  ln -sfn "$so" "$TOOLKIT/lib/lib$lib.so"
done
"$TOOLKIT/bin/nvcc" --version | tail -n 2 >&2
touch "$ROOT/.complete"
echo "$TOOLKIT"
