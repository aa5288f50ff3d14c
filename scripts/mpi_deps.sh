#!/usr/bin/env bash
# Installs what the MPI tests drive for real: Open MPI's mpirun (Debian's openmpi-bin, with
# libopenmpi-dev) and mpi4py in .venv (its wheel loads the system's libmpi.so.40, so no
# compiler is needed). Safe to run again: does nothing when they are there. Installing the
# Debian packages needs root or sudo on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MPI4PY="mpi4py==4.1.2"
need=()
for pkg in openmpi-bin libopenmpi-dev; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == *"ok installed" ]] || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "mpi_deps: need root (or sudo) to install: ${need[*]}" >&2
      exit 1
    }
    sudo=(sudo)
  fi
  echo "mpi_deps: installing ${need[*]}"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
py=.venv/bin/python
[ -x "$py" ] || {
  echo "mpi_deps: no .venv here: run scripts/setup.sh first" >&2
  exit 1
}
if ! "$py" -c "import mpi4py, sys; sys.exit(mpi4py.__version__ != '${MPI4PY#*==}')" 2>/dev/null; then
  echo "mpi_deps: installing $MPI4PY"
  out=$("$py" -m pip install --quiet --disable-pip-version-check "$MPI4PY" 2>&1) || {
    echo "$out" >&2
    exit 1
  }
  grep -v "^WARNING: Location" <<<"$out" || true
fi
