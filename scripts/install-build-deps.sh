#!/usr/bin/env bash
# Installs what building llama.cpp needs (cmake, a C/C++ compiler, libclang for bindgen) when missing.
set -euo pipefail
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v clang >/dev/null 2>&1 || missing+=(clang)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-venv)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "Installing build prerequisites: ${missing[*]}" >&2
if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
  echo "Please install as root: apt-get install -y ${missing[*]}" >&2; exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "No apt-get here; please install: ${missing[*]} (and a Rust toolchain from rustup.rs)" >&2; exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
