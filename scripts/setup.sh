#!/usr/bin/env bash
# Creates .venv (once) and installs trainguard into it with the extras named in $1
# (default: test). Safe to run again: pip skips what is already there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-test}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Python compiles a module when it is first imported and keeps the bytecode, unless
# PYTHONDONTWRITEBYTECODE is set: then pip compiles everything now (half the install's time,
# for the few modules a run imports), else only what is imported gets compiled, once.
compile=()
if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  compile=(--no-compile)
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check "${compile[@]}" \
  -e ".[${extras}]" 2>&1 | grep -v "^WARNING: Location" || true
