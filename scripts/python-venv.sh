#!/usr/bin/env bash
# Creates (once) the virtualenv the end-to-end tests use, outside the clone so CI reuses it.
set -euo pipefail
venv=${GANTRY_VENV:-$HOME/.cache/gantry/venv}
req=$(dirname "$0")/../tests/e2e/requirements.txt
stamp="$venv/.requirements.sha"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || { python3 -m pip install -q virtualenv && python3 -m virtualenv -q "$venv"; }
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi
echo "$venv"
