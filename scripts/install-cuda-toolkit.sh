#!/usr/bin/env bash
# Prints the root of a CUDA toolkit to build Gantry's `cuda` feature with (CUDA_PATH), installing
# one from NVIDIA's packages on PyPI when none is at hand.
#
# An installed toolkit wins: $CUDA_PATH when it holds bin/nvcc, else the directory of the `nvcc`
# on the PATH. Otherwise the wheels of one CUDA release (nvcc, the runtime, cuBLAS, CCCL,
# the CRT headers and NVVM: about 570 MB) are downloaded with their sha256 checked against PyPI's,
# and unpacked into ~/.cache/gantry/cuda/<version>, where they form the usual layout (bin/nvcc,
# include/, lib/, nvvm/). The links CMake's FindCUDAToolkit expects are added (lib64, the
# unversioned libcudart.so / libcublas.so / libcublasLt.so). The wheels hold no libcuda.so (the
# driver's), so builds against this toolkit use GGML_CUDA_NO_VMM (llama.cpp's memory pool without
# the driver API's virtual memory; see the Makefile's build-gpu), and shared cuBLAS (the wheels
# hold no static cuBLAS).
#
# Every wheel is taken at the version NVIDIA released with that nvcc: the newest release of the
# `cuda-toolkit` meta-package on PyPI that pins nvidia-cuda-nvcc to CUDA_WHEEL_VERSION names the
# runtime, cuBLAS, CCCL, CRT and NVVM of the same CUDA release (a newer cuBLAS's headers need a
# newer runtime than that nvcc's).
#
# Usage: scripts/install-cuda-toolkit.sh [--resolve]   (--resolve: print the chosen wheels, one
# "package version file" per line, and install nothing)
# Environment: CUDA_WHEEL_VERSION (the nvcc release, default below), GANTRY_CACHE (default
# ~/.cache/gantry), PYPI_URL (default https://pypi.org), GANTRY_CUDA_FROM_PYPI=1 ignores an
# installed toolkit.
set -euo pipefail

VERSION="${CUDA_WHEEL_VERSION:-13.5.37}"
MAJOR="${VERSION%%.*}"
PYPI_URL="${PYPI_URL:-https://pypi.org}"
CACHE="${GANTRY_CACHE:-$HOME/.cache/gantry}/cuda"
log() { echo "[cuda-toolkit] $*" >&2; }

RESOLVE_ONLY=0
[ "${1:-}" = --resolve ] && RESOLVE_ONLY=1

if [ "$RESOLVE_ONLY" = 0 ] && [ "${GANTRY_CUDA_FROM_PYPI:-0}" != 1 ]; then
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
# .complete lists the wheels unpacked there. A toolkit without that list was put together before
# the versions came from the meta-package (cuBLAS at its newest, maybe too new): it is redone.
if [ "$RESOLVE_ONLY" = 0 ] && [ -x "$TOOLKIT/bin/nvcc" ] && grep -q '^nvidia-cublas ' "$ROOT/.complete" 2>/dev/null; then
  echo "$TOOLKIT"
  exit 0
fi
for tool in curl python3 unzip sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing $tool (try scripts/install-build-deps.sh)"; exit 1; }
done

# One line per wheel: package, version, URL, sha256, file name (manylinux x86_64).
PLAN="$(python3 - "$PYPI_URL" "$VERSION" <<'PY'
import hashlib, io, json, re, sys, urllib.parse, urllib.request, zipfile

pypi, version = sys.argv[1:3]
line_of_release = version.split(".")[:2]  # toolkit X.Y.* ships nvcc X.Y.*
PACKAGES = ["nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cublas",
            "nvidia-cuda-cccl"]

def releases(name):
    url = f"{pypi}/pypi/{name}/json"
    with urllib.request.urlopen(url) as response:
        return url, json.load(response)["releases"]

def key(v):
    return [int(p) if p.isdigit() else -1 for p in v.split(".")]

def download(base, f):
    with urllib.request.urlopen(urllib.parse.urljoin(base, f["url"])) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != f["digests"]["sha256"]:
        sys.exit(f"sha256 mismatch for {f['filename']}")
    return data

def pins(base, files):
    """The versions one cuda-toolkit release pins for its components (its `all` extra)."""
    wheel = next((f for f in files if f["packagetype"] == "bdist_wheel"), None)
    if wheel is None:
        return {}
    archive = zipfile.ZipFile(io.BytesIO(download(base, wheel)))
    metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    found = {}
    for line in archive.read(metadata).decode().splitlines():
        m = re.match(r"Requires-Dist: *([A-Za-z0-9_.-]+) *== *([0-9][0-9.]*?)(\.\*)? *;.*extra *== *[\"']all[\"']", line)
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found

base, toolkit_releases = releases("cuda-toolkit")
candidates = [v for v in toolkit_releases if re.fullmatch(r"[0-9.]+", v) and v.split(".")[:2] == line_of_release]
chosen, seen = None, []
for release in sorted(candidates, key=key, reverse=True):
    pinned = pins(base, toolkit_releases[release])
    seen.append(f"{release}: nvcc {pinned.get('nvidia-cuda-nvcc', '?')}")
    if pinned.get("nvidia-cuda-nvcc") == version:
        chosen = (release, pinned)
        break
if chosen is None:
    sys.exit(f"no cuda-toolkit release on {pypi} pins nvidia-cuda-nvcc=={version} ({'; '.join(seen) or 'none of that line'})")
release, pinned = chosen
print(f"cuda-toolkit {release} pins nvcc {version}", file=sys.stderr)

def wheel(files):
    for f in files or []:
        if f["packagetype"] == "bdist_wheel" and "manylinux" in f["filename"] and "x86_64" in f["filename"]:
            return f

for name in PACKAGES:
    pin = pinned.get(name)
    if pin is None:
        sys.exit(f"cuda-toolkit {release} pins no {name}")
    index, package_releases = releases(name)
    # A pin `==X.*` takes X itself or its newest post-release X.n.
    matching = [v for v in package_releases if (v == pin or v.startswith(pin + ".")) and wheel(package_releases[v])]
    if not matching:
        sys.exit(f"no manylinux x86_64 wheel of {name} {pin} (pinned by cuda-toolkit {release})")
    v = max(matching, key=key)
    f = wheel(package_releases[v])
    print(name, v, urllib.parse.urljoin(index, f["url"]), f["digests"]["sha256"], f["filename"])
PY
)"
if [ "$RESOLVE_ONLY" = 1 ]; then
  awk '{ print $1, $2, $5 }' <<<"$PLAN"
  exit 0
fi

WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"
# Unpacked afresh: wheels of another release left in place would mix with these.
rm -rf "$ROOT"
mkdir -p "$ROOT"
while read -r name version url sha file; do
  if [ ! -f "$WHEELS/$file" ] || ! echo "$sha  $WHEELS/$file" | sha256sum -c --quiet >/dev/null 2>&1; then
    log "downloading $file"
    curl -fsSL -o "$WHEELS/$file.part" "$url"
    mv "$WHEELS/$file.part" "$WHEELS/$file"
  fi
  echo "$sha  $WHEELS/$file" | sha256sum -c --quiet || { log "sha256 mismatch for $file"; exit 1; }
  unzip -qo "$WHEELS/$file" 'nvidia/*' -d "$ROOT"
done <<<"$PLAN"

[ -x "$TOOLKIT/bin/nvcc" ] || { log "the wheels did not give $TOOLKIT/bin/nvcc"; exit 1; }
# What CMake's FindCUDAToolkit and the linker look for in a toolkit root.
ln -sfn lib "$TOOLKIT/lib64"
for lib in cudart cublas cublasLt; do
  so="$(cd "$TOOLKIT/lib" && ls "lib$lib.so."* 2>/dev/null | sort | head -n 1)"
  [ -n "$so" ] || { log "lib$lib.so.* missing from the wheels"; exit 1; }
  ln -sfn "$so" "$TOOLKIT/lib/lib$lib.so"
done
"$TOOLKIT/bin/nvcc" --version | tail -n 2 >&2
awk '{ print $1, $2 }' <<<"$PLAN" >"$ROOT/.complete"
echo "$TOOLKIT"
