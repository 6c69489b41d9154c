#!/usr/bin/env bash
# Install Debian's headless-capable `chromium` for the report rendering test (tests/test_report_chromium.py).
# Idempotent: does nothing when a chromium binary is already on PATH.
set -euo pipefail
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then echo "setup-chromium: $(command -v "$b") present"; exit 0; fi
done
if [ "$(id -u)" != 0 ]; then echo "setup-chromium: need root to install chromium" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium
