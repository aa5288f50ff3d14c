#!/usr/bin/env bash
# Creates .venv (once) and installs trainguard into it with the extras named in $1
# (default: test). Safe to run again: pip skips what is already there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-test}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]" 2>&1 \
  | grep -v "^WARNING: Location" || true
