#!/usr/bin/env bash
# Gathers the portable build (`make build-portable`) into one directory that runs anywhere on
# x86-64 Linux: the `gantry` binary, llama.cpp's shared libraries (found through the binary's
# $ORIGIN rpath) and ggml's CPU backend variants (libggml-cpu-<variant>.so, one per x86 level; the
# binary loads the best one for the CPU at start, see crates/engine/src/model/cpu_variants.rs).
#
# Usage: scripts/collect-portable.sh RELEASE_DIR OUT_DIR
#   RELEASE_DIR  cargo's profile directory of that build (target/variants/release)
#   OUT_DIR      emptied, then filled
set -euo pipefail

release="$1"
out="$2"
[ -x "$release/gantry" ] || { echo "no gantry binary in $release (run make build-portable)" >&2; exit 1; }

# llama-cpp-sys-2's build script installs the variants into its OUT_DIR/backends; the newest
# build directory that has them is this build's.
backends="$(ls -dt "$release"/build/llama-cpp-sys-2-*/out/backends 2>/dev/null | head -n 1)"
[ -n "$backends" ] && ls "$backends"/libggml-cpu-*.so >/dev/null 2>&1 \
  || { echo "no libggml-cpu-*.so under $release/build/llama-cpp-sys-2-*/out/backends" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
cp -p "$release/gantry" "$out/"
# The shared libraries come from the same install (cargo's copies in RELEASE_DIR are only the
# unversioned links); their soname links (libx.so.0 -> libx.so.0.26.0) are kept as links.
for lib in "${backends%/backends}"/lib/lib*.so*; do
  cp -P -p "$lib" "$out/"
done
cp -p "$backends"/libggml-cpu-*.so "$out/"
# The release profile keeps DWARF debug info (~130 MB of the binary): drop it from the copies that
# travel. Symbols stay, so panics and `perf` still name functions.
strip --strip-debug "$out/gantry"

# Every library the binary needs must resolve inside OUT_DIR or the base system.
if missing="$(ldd "$out/gantry" | grep 'not found')"; then
  echo "unresolved libraries:" >&2
  echo "$missing" >&2
  exit 1
fi
echo "$out: gantry + $(ls "$out"/libggml-cpu-*.so | wc -l) CPU variants ($(du -sh "$out" | cut -f1))" >&2
