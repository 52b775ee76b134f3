#!/usr/bin/env bash
# Prints the extra C/C++ compiler flags that a build "native for this host" (-march=native,
# llama.cpp's GGML_NATIVE=ON) needs on this machine, on one line (often an empty line).
#
# Used by the Makefile's release build of Gantry (through CFLAGS/CXXFLAGS, which the `cmake` crate
# passes to llama.cpp's CMake) and by scripts/build-reference-llama-server.sh, so both servers are
# compiled for the same instruction sets.
#
# The one adjustment today is AMX. -march=native turns on AMX whenever the CPU reports it, but a
# process may only use the AMX tile registers after asking the kernel for them
# (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); in VMs whose kernel or hypervisor does not
# grant that state, llama.cpp's AMX path crashes at start. /proc/cpuinfo alone cannot tell, so a tiny
# C program makes the request. When the compiler would enable AMX and the kernel does not grant it,
# this prints -mno-amx-tile -mno-amx-int8 -mno-amx-bf16; GCC and Clang let an explicit -mno-* win
# over what -march=native implies, whichever comes first on the command line.
#
# Environment (for tests; each replaces one probe with a fixed answer):
#   NATIVE_FLAGS_ARCH=<uname -m>            the machine architecture
#   NATIVE_FLAGS_CPU_AMX=0|1                whether -march=native would enable AMX on this CPU
#   NATIVE_FLAGS_AMX_GRANTED=0|1            whether the kernel grants the AMX tile state
#   CC                                      the C compiler for the probes (default: cc)
# With --explain, the decision is also written to stderr.
set -euo pipefail

AMX_OFF="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CC="${CC:-cc}"
explain=0
[ "${1:-}" = "--explain" ] && explain=1
say() { if [ "$explain" = 1 ]; then echo "[native-build-flags] $*" >&2; fi; }

arch="${NATIVE_FLAGS_ARCH:-$(uname -m)}"
if [ "$arch" != "x86_64" ]; then
  say "$arch: no x86 ISA adjustments"
  echo ""
  exit 0
fi

# Would -march=native turn AMX on? Asking the compiler that will build llama.cpp is exact (it reads
# CPUID itself); /proc/cpuinfo's amx_tile flag is the fallback when no compiler answers.
cpu_amx() {
  if [ -n "${NATIVE_FLAGS_CPU_AMX:-}" ]; then
    echo "$NATIVE_FLAGS_CPU_AMX"
    return
  fi
  local macros
  if macros="$("$CC" -march=native -dM -E - </dev/null 2>/dev/null)"; then
    if grep -q '__AMX_TILE__' <<<"$macros"; then echo 1; else echo 0; fi
    return
  fi
  if grep -qw 'amx_tile' /proc/cpuinfo 2>/dev/null; then echo 1; else echo 0; fi
}

# Does the kernel grant this process the AMX tile data state? Any failure to compile or run the
# probe counts as "no": a missing AMX kernel path is slower, a wrongly enabled one crashes.
amx_granted() {
  if [ -n "${NATIVE_FLAGS_AMX_GRANTED:-}" ]; then
    echo "$NATIVE_FLAGS_AMX_GRANTED"
    return
  fi
  local dir
  dir="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$dir'" RETURN
  cat >"$dir/amx.c" <<'EOF'
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
int main(void) { return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : 1; }
EOF
  if "$CC" -O0 -o "$dir/amx" "$dir/amx.c" >/dev/null 2>&1 && "$dir/amx"; then echo 1; else echo 0; fi
}

has_amx="$(cpu_amx)"
if [ "$has_amx" != 1 ]; then
  say "x86_64 without AMX under -march=native: no adjustments"
  echo ""
  exit 0
fi
granted="$(amx_granted)"
if [ "$granted" = 1 ]; then
  say "AMX present and granted by the kernel: -march=native keeps it"
  echo ""
else
  say "AMX present but the kernel does not grant XTILEDATA: $AMX_OFF"
  echo "$AMX_OFF"
fi
