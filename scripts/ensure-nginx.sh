#!/usr/bin/env bash
# Installs nginx from Debian's packages when it is missing: the cluster test puts it in front of
# several replicas as their load balancer. Prints the binary's path.
set -euo pipefail
for b in /usr/sbin/nginx /usr/bin/nginx /usr/local/sbin/nginx; do
  if [[ -x "$b" ]]; then echo "$b"; exit 0; fi
done
echo "[ensure-nginx] installing nginx-light (apt-get)" >&2
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || { echo "[ensure-nginx] need root or sudo to apt-get install nginx-light" >&2; exit 1; }
  SUDO="sudo"
fi
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light >&2 \
  || { $SUDO apt-get update -q >&2 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light >&2; }
# The package may start a system nginx on port 80; the tests start their own.
command -v nginx
