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
  # Side by side on 4 workers: most end-to-end tests wait on their child processes, so
  # more workers than this machine's 2 cores pay. Tests that share one thing (a cluster,
  # PostgreSQL, Chromium, the kernel log) run in turn on one worker: tests/conftest.py
  # puts each such family in one xdist group.
  python -m pytest -q -n "${TG_TEST_WORKERS:-4}" --dist loadgroup --durations=40 \
    --cov=trainguard --cov-report=term:skip-covered --cov-fail-under=70
else
  python -m pytest -q "$@"
fi
