#!/usr/bin/env bash
# Checks that a shared-library build of Gantry (make build-gpu's target/cuda/release) runs as
# built, without LD_LIBRARY_PATH:
#   - no lib*.so* link beside the binary points to a file that is not there;
#   - every library there that loads another one (of the build's, or CUDA's) has $ORIGIN in its
#     run path (RUNPATH or RPATH), as has the binary;
#   - ldd, with LD_LIBRARY_PATH unset, resolves everything the binary and those libraries need,
#     except the driver's libcuda.so.1 on a machine without an NVIDIA driver;
#   - where nothing is missing, `gantry --version` runs.
# Prints one line per finding and exits 1 if any check failed.
#
# Usage: scripts/check-gpu-tree.sh DIR   (default target/cuda/release)
set -uo pipefail

dir="${1:-target/cuda/release}"
bin="$dir/gantry"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }

[ -x "$bin" ] || { echo "FAIL: no gantry binary in $dir (make build-gpu)"; exit 1; }
command -v readelf >/dev/null && command -v ldd >/dev/null || { echo "FAIL: readelf and ldd are needed (binutils, libc-bin)"; exit 1; }

shopt -s nullglob
libs=("$dir"/lib*.so*)
[ "${#libs[@]}" -gt 0 ] || fail "no lib*.so* in $dir (not a shared build?)"

# Links that lead nowhere.
for lib in "${libs[@]}"; do
  if [ -L "$lib" ] && [ ! -e "$lib" ]; then
    fail "$(basename "$lib") -> $(readlink "$lib"): dangling link"
  fi
done

runpath() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p' | head -n 1; }
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

# The ELF files themselves (each once, whatever links name them), and the binary.
declare -A seen=()
files=("$bin")
for lib in "${libs[@]}"; do
  [ -e "$lib" ] || continue
  real="$(readlink -f "$lib")"
  [ -n "${seen[$real]:-}" ] && continue
  seen[$real]=1
  files+=("$lib")
done

for f in "${files[@]}"; do
  name="$(basename "$f")"
  loads=()
  for n in $(needed "$f"); do
    if [ -e "$dir/$n" ] || [[ "$n" == libcu* ]]; then loads+=("$n"); fi
  done
  [ "${#loads[@]}" -gt 0 ] || continue
  rp="$(runpath "$f")"
  if [[ ":$rp:" == *':$ORIGIN:'* || ":$rp:" == *':$ORIGIN/:'* ]]; then
    ok "$name loads ${loads[*]}; run path $rp"
  else
    fail "$name loads ${loads[*]} but its run path (${rp:-none}) lacks \$ORIGIN" \
      "(built before make build-gpu set CMAKE_INSTALL_RPATH? remove $dir/build/llama-cpp-sys-2-* and build again)"
  fi
done

# What the dynamic loader finds, as a user's shell would run it.
driver_missing=0
for f in "${files[@]}"; do
  while read -r missing; do
    case "$missing" in
      libcuda.so.1) driver_missing=1 ;;
      *) fail "$(basename "$f") needs $missing: not found without LD_LIBRARY_PATH" ;;
    esac
  done < <(env -u LD_LIBRARY_PATH ldd "$f" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p')
done
if [ "$driver_missing" = 1 ]; then
  echo "note: libcuda.so.1 (the NVIDIA driver's) is not on this machine; everything else resolves" \
    "and the binary is not started here"
elif [ "$failures" = 0 ]; then
  if version="$(env -u LD_LIBRARY_PATH "$bin" --version 2>&1)"; then
    ok "$version runs without LD_LIBRARY_PATH"
  else
    fail "gantry --version failed: $version"
  fi
fi

if [ "$failures" -gt 0 ]; then
  echo "$dir: $failures problems"
  exit 1
fi
echo "$dir: runs as built"
