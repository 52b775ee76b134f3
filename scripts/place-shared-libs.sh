#!/usr/bin/env bash
# Puts llama.cpp's shared libraries next to a binary built with LLAMA_BUILD_SHARED_LIBS=1 (make
# build-gpu), so that the binary runs as built, found through the $ORIGIN in its run path.
#
# llama-cpp-sys-2's build script hard-links OUT_DIR/lib/lib*.so into cargo's profile directory,
# but those are the unversioned names, which CMake installs as links (libx.so -> libx.so.0): the
# profile directory is left with links to libx.so.0 files that are not there, while the binary
# asks for libx.so.0 (the soname). This copies the install's versioned names beside them, links
# as links and files as files (libx.so.0 -> libx.so.0.9.4), each replaced in one rename so that
# a running server keeps the copy it mapped.
#
# Usage: scripts/place-shared-libs.sh RELEASE_DIR   (cargo's profile directory, target/cuda/release)
set -euo pipefail

release="${1:?usage: $0 RELEASE_DIR}"
[ -x "$release/gantry" ] || { echo "no gantry binary in $release" >&2; exit 1; }

# The build script's install; the newest one that holds shared libraries is this build's.
lib=""
for dir in $(ls -dt "$release"/build/llama-cpp-sys-2-*/out/lib 2>/dev/null); do
  if ls "$dir"/libllama.so.* >/dev/null 2>&1; then
    lib="$dir"
    break
  fi
done
[ -n "$lib" ] || { echo "no libllama.so.* under $release/build/llama-cpp-sys-2-*/out/lib (not a shared build?)" >&2; exit 1; }

placed=0
for src in "$lib"/lib*.so.*; do
  name="$(basename "$src")"
  cp -P -p "$src" "$release/.$name.tmp"
  mv -fT "$release/.$name.tmp" "$release/$name"
  # The build script left the same links in deps/ and examples/; dangling, they make its next run
  # fail (it hard-links there unless the name resolves: "File exists"). A link to the copy above
  # resolves them.
  for sub in deps examples; do
    if [ -d "$release/$sub" ]; then
      ln -sfn "../$name" "$release/$sub/.$name.tmp"
      mv -fT "$release/$sub/.$name.tmp" "$release/$sub/$name"
    fi
  done
  placed=$((placed + 1))
done
echo "placed $placed versioned libraries from $lib in $release" >&2
