#!/usr/bin/env bash
# `make test-container`: builds the project's Dockerfile with podman and serves the OpenAI SDK from
# the image, on a machine that cannot pull base images. Both bases are made here, cached outside
# the clone ($GANTRY_CONTAINER_CACHE, default ~/.cache/gantry/container):
#   localhost/debian:bookworm-slim   a debootstrap (minbase) bookworm rootfs, `podman import`ed
#   localhost/rust:X.Y-bookworm      that rootfs + the host's active rustup toolchain in /usr/local
#                                    (scripts/container/rust-base.Containerfile)
# then `podman build --format docker` of ./Dockerfile with BUILD_IMAGE/RUNTIME_IMAGE pointing at
# them, and `podman run` of the image with the model directory mounted: waits for the image's
# HEALTHCHECK (/health/ready), creates a key in the container, sends a chat completion through the
# official `openai` SDK (answer and usage), checks the server runs as uid 10001, then `podman stop`
# (SIGTERM) and checks that it drained and exited 0. Exits non-zero on the first failed check.
# `--bases-only` makes (or checks) the two base images and stops.
#
# Heavy steps (debootstrap, podman build: llama.cpp in release mode) run under `nice -n 19`.
#
# Podman settings this needs on a host like the one it was written on (root without
# CAP_SYS_RESOURCE, cgroup v1 with the v2 hierarchy also mounted at /sys/fs/cgroup/unified, no
# systemd), each applied to every podman command below:
#   --runtime runc       crun (podman's default) refuses hybrid cgroups ("cgroups in hybrid mode
#                        not supported"), also with --cgroups=disabled; runc with the cgroupfs
#                        manager runs.
#   --ulimit nofile/nproc  podman asks for nofile=nproc=1048576 by default, which a root without
#                        CAP_SYS_RESOURCE cannot set ("setrlimit ... Operation not permitted");
#                        nofile gets this shell's hard limit, nproc the kernel's pid_max (podman
#                        lowers its own nproc to that, and a container cannot go above it).
#                        `--ulimit host` fails the same way in podman 4.3.
#   healthchecks         podman schedules HEALTHCHECKs with systemd timers; without systemd it logs
#                        "unable to get systemd connection" and this script runs
#                        `podman healthcheck run` itself, which runs the image's own command.
# Defaults kept: overlay storage, the netavark bridge network (the port is published on
# 127.0.0.1 only), the OCI isolation for build steps.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${GANTRY_CONTAINER_CACHE:-$HOME/.cache/gantry/container}
MODELS_DIR=${GANTRY_MODELS_DIR:-$HOME/.cache/gantry/models}
MODEL=${MODEL:-smollm2-135m}
IMAGE=${IMAGE:-localhost/gantry:test}
PORT=${PORT:-18080}
NAME=${NAME:-gantry-container-test}
RUNTIME_BASE=localhost/debian:bookworm-slim
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
NICE=(nice -n 19)

step() { printf '\n== %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
t0=$SECONDS
elapsed() { local s=$((SECONDS - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

step "tools"
missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "installing ${missing[*]} (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >/dev/null
fi
ok "$(podman --version), $(runc --version | head -1)"

nofile=$(ulimit -Hn)
nproc=$(cat /proc/sys/kernel/pid_max)
hard_nproc=$(ulimit -Hu)
[[ $hard_nproc != unlimited && $hard_nproc -lt $nproc ]] && nproc=$hard_nproc
[[ $nofile == unlimited ]] && nofile=1048576
PODMAN=(podman --runtime runc)
ULIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
echo "podman settings: --runtime runc ${ULIMITS[*]}"

step "runtime base $RUNTIME_BASE"
mkdir -p "$CACHE"
if ! podman image exists "$RUNTIME_BASE"; then
  rootfs=$CACHE/bookworm-rootfs
  if [[ ! -d $rootfs ]]; then
    t=$SECONDS
    rm -rf "$rootfs.tmp"
    "${NICE[@]}" debootstrap --variant=minbase bookworm "$rootfs.tmp" "$DEBIAN_MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log"; fail "debootstrap (log: $CACHE/debootstrap.log)"; }
    # As the official slim image: updates and security suites, no package caches or lists.
    cat > "$rootfs.tmp/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    rm -rf "$rootfs.tmp"/var/cache/apt/archives/*.deb "$rootfs.tmp"/var/lib/apt/lists/*
    mv "$rootfs.tmp" "$rootfs"
    echo "debootstrap: $(elapsed $t)"
  fi
  tar -C "$rootfs" -c . | podman import -q --change 'CMD ["bash"]' - "$RUNTIME_BASE" >/dev/null
fi
ok "$RUNTIME_BASE $(podman image inspect -f '{{.Id}}' "$RUNTIME_BASE" | cut -c1-12)"

step "build base"
sysroot=$(rustc --print sysroot)
toolchain=$(rustc --version)
rust_minor=$(rustc --version | sed -E 's/^rustc ([0-9]+\.[0-9]+).*/\1/')
BUILD_BASE=localhost/rust:$rust_minor-bookworm
ca_sum=$(cat /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-16)
want="$toolchain; ca $ca_sum; $(sha256sum scripts/container/rust-base.Containerfile | cut -c1-16)"
have=$(podman image inspect -f '{{index .Labels "io.gantry.toolchain"}}' "$BUILD_BASE" 2>/dev/null || true)
if [[ $have != "$want" ]]; then
  t=$SECONDS
  ctx=$CACHE/rust-base-context
  rm -rf "$ctx"; mkdir -p "$ctx/toolchain/share" "$ctx/ca"
  # Hard links where the cache shares the toolchain's filesystem (no copy of ~600 MB), else a copy.
  for d in bin lib libexec etc; do
    [[ -d $sysroot/$d ]] && { cp -al "$sysroot/$d" "$ctx/toolchain/" 2>/dev/null || cp -a "$sysroot/$d" "$ctx/toolchain/"; }
  done
  for d in "$sysroot"/share/*; do
    [[ $(basename "$d") == doc ]] || cp -a "$d" "$ctx/toolchain/share/"
  done
  cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
  "${NICE[@]}" "${PODMAN[@]}" build -q "${ULIMITS[@]}" --pull=never \
    --build-arg BASE_IMAGE="$RUNTIME_BASE" --build-arg TOOLCHAIN="$want" \
    -f scripts/container/rust-base.Containerfile -t "$BUILD_BASE" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "build base: $(elapsed $t)"
fi
ok "$BUILD_BASE ($toolchain from $sysroot)"
[[ ${1:-} == --bases-only ]] && { echo "--bases-only: stopping before the image build"; exit 0; }

step "podman build of ./Dockerfile -> $IMAGE (llama.cpp in release mode: long the first time)"
t=$SECONDS
"${NICE[@]}" "${PODMAN[@]}" build "${ULIMITS[@]}" --pull=never --format docker \
  --build-arg BUILD_IMAGE="$BUILD_BASE" --build-arg RUNTIME_IMAGE="$RUNTIME_BASE" \
  -t "$IMAGE" . 2>&1 | tee "$CACHE/build.log" \
  | { grep -E --line-buffered '^(STEP|COMMIT|Successfully)|Compiling gantry|Finished|error' || true; } || build_rc=$?
[[ ${build_rc:-0} == 0 ]] || { tail -40 "$CACHE/build.log"; fail "podman build (log: $CACHE/build.log)"; }
build_time=$(elapsed $t)
ok "built $IMAGE in $build_time"
health=$(podman image inspect -f '{{json .HealthCheck}}' "$IMAGE")
[[ $health == *health/ready* ]] || fail "the image has no HEALTHCHECK on /health/ready: $health"
ok "image HEALTHCHECK: $health"
user=$(podman image inspect -f '{{.User}}' "$IMAGE")
[[ $user == 10001:10001 ]] || fail "image USER is '$user', not 10001:10001"
ok "image USER $user"

step "model $MODEL"
# shared/models/fetch.sh (beside the clone, or /work/shared) or a debug build's `models pull`; both
# keep a verified file as it is.
fetch=${GANTRY_FETCH:-}
for f in ../shared/models/fetch.sh /work/shared/models/fetch.sh; do
  [[ -z $fetch && -x $f ]] && fetch=$f
done
if [[ -n $fetch ]]; then
  "$fetch" "$MODELS_DIR" "$MODEL" >/dev/null || fail "$fetch $MODELS_DIR $MODEL"
elif [[ -x target/debug/gantry ]]; then
  GANTRY_CACHE_DIR=$(dirname "$MODELS_DIR") target/debug/gantry models pull --quiet "$MODEL" >/dev/null
fi
ls "$MODELS_DIR"/*.gguf >/dev/null 2>&1 || fail "no model in $MODELS_DIR (fetch $MODEL first)"
ok "$MODELS_DIR: $(cd "$MODELS_DIR" && ls -- *.gguf | tr '\n' ' ')"

step "podman run"
cleanup() { podman rm -f -v "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
# The image's own CMD (serve on 0.0.0.0:8080, drain 12 s, grace 30 s); the container's port is
# published on loopback only. The host's model directory is the image's /models/models.
# GANTRY_PUBLIC_METRICS: /metrics below without an admin token (the image's CMD sets none).
"${PODMAN[@]}" run -d --name "$NAME" "${ULIMITS[@]}" -p "127.0.0.1:$PORT:8080" \
  -v "$MODELS_DIR:/models/models:ro" -e GANTRY_MODEL="$MODEL" -e GANTRY_PUBLIC_METRICS=true "$IMAGE" 2> >(grep -v 'unable to get systemd connection' >&2) >/dev/null
t=$SECONDS
until "${PODMAN[@]}" healthcheck run "$NAME" >/dev/null 2>&1; do
  state=$(podman inspect -f '{{.State.Status}}' "$NAME")
  [[ $state == running ]] || { podman logs "$NAME" | tail -30; fail "the container is $state"; }
  ((SECONDS - t < 180)) || { podman logs "$NAME" | tail -30; fail "not healthy after 180 s"; }
  sleep 2
done
status=$(podman inspect -f '{{.State.Health.Status}}' "$NAME")
[[ $status == healthy ]] || fail "health status '$status'"
ok "HEALTHCHECK passed after $((SECONDS - t)) s: $status; $(curl -fsS "http://127.0.0.1:$PORT/health/ready")"

pid=$(podman inspect -f '{{.State.Pid}}' "$NAME")
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
[[ $uid == 10001 ]] || fail "the server (pid $pid on the host) runs as uid $uid"
ok "the server runs as uid $uid ($(podman exec "$NAME" id))"

# The image is the portable build: it chose one of ggml's CPU variants for this host at start.
info=$(curl -fsS "http://127.0.0.1:$PORT/metrics" | grep '^gantry_cpu_backend_info{' || true)
variant=$(sed -n 's/.*variant="\([^"]*\)".*/\1/p' <<<"$info")
[[ -n $variant && $variant != built-in ]] || fail "no CPU variant chosen in /metrics: '$info'"
podman logs "$NAME" 2>&1 | sed -E 's/\x1b\[[0-9;]*m//g' | grep -q "CPU backend variant=$variant " \
  || fail "the log does not name the CPU variant $variant"
ok "CPU kernels: the $variant variant, in the log and /metrics"

key=$(podman exec "$NAME" gantry keys create --name container-test 2>/dev/null | tail -1)
[[ -n $key ]] || fail "gantry keys create printed no secret"
ok "created a key in the container (${key:0:12}…)"

venv=$(scripts/python-venv.sh)
GANTRY_URL="http://127.0.0.1:$PORT/v1" GANTRY_KEY="$key" "$venv/bin/python" - <<'EOF' || fail "chat completion through the openai SDK"
import os
import openai
client = openai.OpenAI(base_url=os.environ["GANTRY_URL"], api_key=os.environ["GANTRY_KEY"], max_retries=0)
models = [m.id for m in client.models.list()]
assert len(models) == 1, models  # the served model, under the id the server gives it
resp = client.chat.completions.create(
    model=models[0],
    messages=[{"role": "user", "content": "What is the capital of France? Answer with one word."}],
    max_tokens=16,
    temperature=0,
)
answer = resp.choices[0].message.content
u = resp.usage
print(f"openai {openai.__version__}: models={models} model={resp.model} finish={resp.choices[0].finish_reason} answer={answer!r} usage={u.prompt_tokens}+{u.completion_tokens}={u.total_tokens}")
assert "paris" in answer.lower(), answer
assert resp.choices[0].finish_reason in ("stop", "length")
assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 16
assert u.total_tokens == u.prompt_tokens + u.completion_tokens
try:
    openai.OpenAI(base_url=os.environ["GANTRY_URL"], api_key="sk-wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError:
    pass
EOF
ok "chat completion through the openai SDK: answer and usage as expected; a wrong key gets 401"

step "podman stop (SIGTERM): drain, then exit 0"
t=$SECONDS
"${PODMAN[@]}" stop --time 60 "$NAME" 2> >(grep -v 'unable to get systemd connection' >&2) >/dev/null &
stopper=$!
ready=""
for _ in $(seq 1 20); do
  ready=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health/ready" || true)
  [[ $ready == 503 ]] && break
  sleep 0.5
done
[[ $ready == 503 ]] || fail "/health/ready did not turn 503 after SIGTERM (got '$ready')"
ok "draining: /health/ready answers 503"
wait "$stopper" || fail "podman stop"
took=$((SECONDS - t))
code=$(podman inspect -f '{{.State.ExitCode}}' "$NAME")
logs=$(podman logs "$NAME" 2>&1)
[[ $code == 0 ]] || { tail -20 <<<"$logs"; fail "exit code $code"; }
grep -q 'draining' <<<"$logs" && grep -q 'stopped' <<<"$logs" || { tail -20 <<<"$logs"; fail "no drain/stop in the logs"; }
((took >= 12 && took < 60)) || fail "stop took $took s (want the 12 s drain, no SIGKILL at 60 s)"
ok "exited 0 after $took s (drain delay 12 s), logs show draining and stopped"

printf '\ntest-container: all checks passed in %s (image build %s)\n' "$(elapsed $t0)" "$build_time"
