#!/usr/bin/env bash
# Before `make test`: the browser tests need a Chromium (they never download one). Prints the
# one found: $MEGA_CHROMIUM, else `chromium` or `chromium-browser` on PATH; as root on Debian or
# Ubuntu, installs the distribution's package where none is found; otherwise stops here with one
# line saying how to get one, instead of failing every browser test.
set -euo pipefail
found() { if [ -n "$1" ] && [ -x "$1" ]; then echo "$1"; exit 0; fi; }
if [ -n "${MEGA_CHROMIUM:-}" ]; then
  found "$MEGA_CHROMIUM"
  echo "make test: MEGA_CHROMIUM=$MEGA_CHROMIUM is not an executable file" >&2
  exit 1
fi
found "$(command -v chromium || true)"
found "$(command -v chromium-browser || true)"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "make test: installing Debian's chromium for the browser tests" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
  found "$(command -v chromium || true)"
fi
echo "make test: the browser tests need Chromium: sudo apt-get install chromium (Debian, Ubuntu)," \
  "or set MEGA_CHROMIUM=/path/to/chromium" >&2
exit 1
