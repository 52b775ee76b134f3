#!/usr/bin/env bash
# Installs Debian's headless Chromium and its chromedriver for the console's browser tests
# (tests/e2e/test_console.py), only when they are missing.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing chromium and chromium-driver for the console's browser tests" >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >&2
