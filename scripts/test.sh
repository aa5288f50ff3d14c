#!/usr/bin/env bash
# Sets up .venv and runs every gate: ruff, ruff format --check, mypy, pytest.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the fast tests.
# It installs what the tests drive (PostgreSQL, Chromium; Open MPI) with scripts/system_deps.sh
# and scripts/mpi_deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
bash scripts/system_deps.sh
bash scripts/mpi_deps.sh
export PATH="$PWD/.venv/bin:$PATH"
ruff check src tests examples bench
ruff format --check src tests examples bench
mypy
if [ "$#" -eq 0 ]; then
  # The whole suite holds a coverage floor (in-process lines; replicas and masters run in
  # child processes and are not counted): measured 72% on the fast tests alone.
  python -m pytest -q --durations=40 --cov=trainguard --cov-report=term:skip-covered --cov-fail-under=70
else
  python -m pytest -q "$@"
fi
