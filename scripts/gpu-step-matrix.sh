#!/usr/bin/env bash
# Gantry alone on a GPU: 64 greedy streams of 256-token answers (issue #34's 5.4k tok/s target)
# under each way of keeping KV entries, so one call on a lent machine says where a step's host
# time goes (gantry-bench prints µs a step per part: admit, cache, batch, decode, sync, pick,
# produce) and what each way costs. Run it where scripts/gpu-bench-remote.sh has collected every
# part (and, for a light bundle, after `wait-reference`: its libraries come from that build).
#
#   scripts/gpu-step-matrix.sh OUT [RUN...]
#
# RUN names the runs to make, all by default:
#   device   the defaults: copies between KV streams on the device (`--kv-copies auto`)
#   host     copies through host memory (GANTRY_KV_COPIES=host), as before session 26
#   nosave   no host memory for idle sequences (GANTRY_CACHE_RAM=0): no state saves at all,
#            so its gain over `device` is what the saves cost (a request taking a slot in
#            place saves what the slot held, an idle sequence is saved as it leaves)
#   prefix   the defaults on the shared-prefix workload (one long system prompt)
# Each writes OUT/<run>/ (report, JSON, bench.log); OUT/summary.txt keeps the lines that matter
# and OUT/dmon.txt the GPU's SM use each second (nvidia-smi dmon), for the busy share.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 OUT [device|host|nosave|prefix ...]" >&2; exit 2; }
out=$1
shift
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(device host nosave prefix)
mkdir -p "$out"
summary="$out/summary.txt"

greedy64=(--servers gantry --workloads chat --concurrency 64 --requests 128 --max-tokens 256 --passes 1)
prefix=(--servers gantry --workloads shared-prefix --passes 1)

nvidia-smi dmon -s u -d 1 >"$out/dmon.txt" 2>&1 &
dmon=$!
trap 'kill $dmon 2>/dev/null' EXIT

run() { # run NAME ENV... -- BENCH-ARGS...
  local name=$1 envs=()
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  echo "=== $name ${envs[*]} $(date +%T)" | tee -a "$summary"
  env "${envs[@]}" "$HERE/gpu-bench-remote.sh" bench "$out/$name" "$@" >"$out/$name.log" 2>&1
  echo "exit $?" >>"$summary"
  grep -E 'tok/s|steps|µs|ubatch|reused|failed|rror|\|' "$out/$name.log" | grep -v '\[gpu-bench\] ldd' | tail -30 >>"$summary"
}

for r in "${runs[@]}"; do
  case "$r" in
    device) run device GANTRY_KV_COPIES=auto -- "${greedy64[@]}" ;;
    host) run host GANTRY_KV_COPIES=host -- "${greedy64[@]}" ;;
    nosave) run nosave GANTRY_CACHE_RAM=0 -- "${greedy64[@]}" ;;
    prefix) run prefix GANTRY_KV_COPIES=auto -- "${prefix[@]}" ;;
    *) echo "unknown run: $r" >&2; exit 2 ;;
  esac
done
echo "=== done $(date +%T)" >>"$summary"
cat "$summary"
