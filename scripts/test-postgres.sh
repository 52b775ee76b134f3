#!/usr/bin/env bash
# Starts (once) a throwaway PostgreSQL on loopback for the test suite and prints its admin URL.
# Installs Debian's postgresql package when no server binaries are found. The cluster lives in
# /tmp and trusts local connections: it is for tests only.
set -euo pipefail

PORT="${GANTRY_TEST_PG_PORT:-55432}"
DIR="${GANTRY_TEST_PG_DIR:-/tmp/gantry-test-postgres-$(id -u)}"
URL="postgres://postgres@127.0.0.1:${PORT}/postgres"

find_bin() {
  local b
  for b in /usr/lib/postgresql/*/bin; do
    if [[ -x "$b/pg_ctl" ]]; then echo "$b"; return 0; fi
  done
  return 1
}

if ! BIN="$(find_bin)"; then
  echo "[test-postgres] installing postgresql (apt-get)" >&2
  SUDO=""
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || { echo "[test-postgres] need root or sudo to apt-get install postgresql" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 \
    || { $SUDO apt-get update -q >&2 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; }
  BIN="$(find_bin)"
fi

# PostgreSQL refuses to run as root: run it as the `postgres` system user then.
as_owner() {
  if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; then
  echo "$URL"
  exit 0
fi

if [[ ! -f "$DIR/PG_VERSION" ]]; then
  rm -rf "$DIR"
  mkdir -p "$DIR"
  [[ "$(id -u)" == 0 ]] && chown postgres: "$DIR"
  as_owner "$BIN/initdb" -D "$DIR" -U postgres --auth=trust --no-sync -E UTF8 >/dev/null
fi
as_owner "$BIN/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c fsync=off -c synchronous_commit=off -c max_connections=300" start >&2
echo "$URL"
