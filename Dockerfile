# Gantry's container image: `podman build --format docker -t gantry .` (podman's default OCI
# format drops HEALTHCHECK) or `docker build -t gantry .`.
#
# Base images are build arguments so a builder without registry access can point them at images
# it imported itself, e.g. a Debian rootfs from debootstrap (`podman import`), with
# `--build-arg RUNTIME_IMAGE=localhost/debian:bookworm-slim`. BUILD_IMAGE must carry cargo and
# rustc (the workspace builds with Rust 1.95; Debian bookworm's own rustc is too old).
ARG BUILD_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
# What llama-cpp-sys-2's build script needs to compile llama.cpp: cmake, a C/C++ compiler and
# libclang for bindgen (the same list as scripts/install-build-deps.sh).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cmake clang libclang-dev g++ make pkg-config ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# One build for every x86-64 host (`make build-portable`): no target-cpu=native (the Makefile's
# `make build` uses it for local runs); instead ggml's CPU backend is compiled once per x86 level
# (libggml-cpu-x64.so … -icelake, -zen4, -sapphirerapids) and gantry loads the best one the CPU
# runs at start (AVX-512/VNNI/BF16 where present, AMX only where the kernel grants it), naming it in
# its log and in /metrics as gantry_cpu_backend_info{variant=…}. The binary finds llama.cpp's shared
# libraries and the variants beside itself ($ORIGIN), so /opt/gantry travels as a whole.
# The caches keep the registry and llama.cpp's build between rebuilds; the files are copied out of
# the cached target dir in the same step. The workspace's own sources are touched first: cargo
# judges freshness by mtime, and a context whose files are older than the cached build (a checkout
# of another commit, a worktree made earlier) would otherwise ship the cached binary of other
# sources (seen here: an image built with an engine a commit old).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    find crates -type f -exec touch {} + \
 && env -u CFLAGS -u CXXFLAGS RUSTFLAGS='-C link-arg=-Wl,-rpath,$ORIGIN' \
      cargo build --release --locked -p gantry-server --features gantry-server/cpu-variants \
 && scripts/collect-portable.sh target/release /opt/gantry

FROM ${RUNTIME_IMAGE}
# libgomp1: llama.cpp's OpenMP threads (libstdc++ and libgcc_s are already in slim);
# ca-certificates: `gantry models pull` fetches over HTTPS with the system's roots;
# curl: the HEALTHCHECK (the slim image has no HTTP client and gantry has no probe subcommand).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgomp1 libstdc++6 ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 gantry \
 && useradd --system --uid 10001 --gid gantry --home-dir /data --no-create-home \
      --shell /usr/sbin/nologin gantry \
 && mkdir -p /data /models \
 && chown gantry:gantry /data /models
COPY --from=build /opt/gantry /opt/gantry
RUN ln -s /opt/gantry/gantry /usr/local/bin/gantry

# Keys and the usage ledger (SQLite, unless GANTRY_DATABASE_URL names PostgreSQL) live in /data;
# pulled models in /models/models (`gantry models pull` writes to $GANTRY_CACHE_DIR/models).
ENV GANTRY_CACHE_DIR=/models \
    GANTRY_DATA_DIR=/data \
    HOME=/data
VOLUME ["/data", "/models"]
USER 10001:10001
EXPOSE 8080

# Ready, not merely alive: answers 200 only while the model is loaded, the database answers and
# the replica is not draining. The start period covers loading a model from the volume.
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:8080/health/ready || exit 1

ENTRYPOINT ["gantry"]
# --drain-delay: on SIGTERM stay up, unready and refusing new chats, long enough for a load
# balancer probing every 10 s to notice, before the listener closes (see docs/replicas.md, "Behind a
# load balancer"). `serve` does not download: pull the model into /models first (`gantry models pull
# NAME`, as compose.yaml's model-pull service and the Kubernetes init container do); GANTRY_MODEL
# picks another one (default: qwen2.5-coder-0.5b).
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--drain-delay", "12", "--shutdown-grace", "30"]
