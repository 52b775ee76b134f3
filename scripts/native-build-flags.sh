#!/usr/bin/env bash
# Prints the extra C/C++ compiler flags that a build "native for this host" (-march=native,
# llama.cpp's GGML_NATIVE=ON) needs on this machine, on one line (often an empty line).
#
# Used by the Makefile's release build of Gantry (through CFLAGS/CXXFLAGS, which the `cmake` crate
# passes to llama.cpp's CMake) and by scripts/build-reference-llama-server.sh, so both servers are
# compiled for the same instruction sets.
#
# The one adjustment today is AMX. -march=native turns on AMX whenever the CPU reports it, and
# llama.cpp's AMX path then crashes at its first product unless two things hold:
# - the kernel grants the process the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM,
#   XFEATURE_XTILEDATA)); some VMs' kernels or hypervisors do not;
# - the compiler keeps the tile configuration that ggml builds on the stack. GCC 12's
#   _tile_loadconfig tells the optimizer it reads 8 of the config's 64 bytes, so the stores of the
#   rows and column widths are dropped and ldtilecfg loads garbage (SIGSEGV in
#   ggml_backend_amx_mul_mat, in llama-server as much as in Gantry).
# /proc/cpuinfo alone cannot tell either, so a tiny C++ program, built by the C++ compiler that
# builds llama.cpp with ggml's own pattern, asks for the state, loads a configuration and reads it
# back. When the compiler would enable AMX and that program fails, this prints -mno-amx-tile
# -mno-amx-int8 -mno-amx-bf16; GCC and Clang let an explicit -mno-* win over what -march=native
# implies, whichever comes first on the command line.
#
# Environment (for tests; each replaces one probe with a fixed answer):
#   NATIVE_FLAGS_ARCH=<uname -m>            the machine architecture
#   NATIVE_FLAGS_CPU_AMX=0|1                whether -march=native would enable AMX on this CPU
#   NATIVE_FLAGS_AMX_GRANTED=0|1            whether AMX code runs here (the kernel grants the tile
#                                           state and the compiler keeps the tile configuration)
#   CC, CXX                                 the compilers for the probes (default: cc, c++)
# With --explain, the decision is also written to stderr.
set -euo pipefail

AMX_OFF="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CC="${CC:-cc}"
CXX="${CXX:-c++}"
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

# Does AMX code built here run here? The kernel must grant the tile data state and the compiler
# must keep the stores of a configuration built as ggml builds it (ggml-cpu/amx/mmq.cpp). Any
# failure to compile or run the probe counts as "no": a missing AMX kernel path is slower, a
# wrongly enabled one crashes.
amx_granted() {
  if [ -n "${NATIVE_FLAGS_AMX_GRANTED:-}" ]; then
    echo "$NATIVE_FLAGS_AMX_GRANTED"
    return
  fi
  local dir
  dir="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$dir'" RETURN
  cat >"$dir/amx.cpp" <<'EOF'
#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tile_config_t {
    uint8_t palette_id = 0;
    uint8_t start_row = 0;
    uint8_t reserved_0[14] = {0};
    uint16_t colsb[16] = {0};
    uint8_t rows[16] = {0};
};
__attribute__((noinline)) static void configure() {
    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    for (int t = 0; t < 8; t++) { tc.rows[t] = 16; tc.colsb[t] = 64; }
    _tile_loadconfig(&tc);
}
int main() {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) return 1;
    configure();
    alignas(64) tile_config_t back;
    _tile_storeconfig(&back);
    _tile_release();
    return back.palette_id == 1 && back.rows[7] == 16 && back.colsb[7] == 64 ? 0 : 2;
}
EOF
  if "$CXX" -O2 -march=native -o "$dir/amx" "$dir/amx.cpp" >/dev/null 2>&1 && "$dir/amx" 2>/dev/null; then
    echo 1
  else
    echo 0
  fi
}

has_amx="$(cpu_amx)"
if [ "$has_amx" != 1 ]; then
  say "x86_64 without AMX under -march=native: no adjustments"
  echo ""
  exit 0
fi
granted="$(amx_granted)"
if [ "$granted" = 1 ]; then
  say "AMX present, granted by the kernel and compiled correctly: -march=native keeps it"
  echo ""
else
  say "AMX present, but the kernel does not grant XTILEDATA or $CXX drops the tile configuration: $AMX_OFF"
  echo "$AMX_OFF"
fi
