#!/usr/bin/env bash
# Installs the Debian packages the tests drive for real: PostgreSQL (a private server is
# started by tests/clusters/postgres.py), Chromium (the web page's browser tests), iproute2
# and util-linux (tests/clusters/hosts.py: hosts that share nothing, in network and mount
# namespaces), and Slurm with MUNGE (tests/clusters/slurmcluster.py: a private 3-node
# cluster on those hosts; it starts its own daemons, with its own configuration and key,
# not the packaged services).
# Safe to run again: does nothing when they are there. Needs root or sudo on a fresh machine.
set -euo pipefail
shopt -s nullglob
need=()
initdb=(/usr/lib/postgresql/*/bin/initdb)
[ "${#initdb[@]}" -gt 0 ] || need+=(postgresql)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
[ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)  # slurmctld, slurmd and the clients
[ -x /usr/sbin/munged ] || need+=(munge)
if [ "${#need[@]}" -eq 0 ]; then
  exit 0
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || {
    echo "system_deps: need root (or sudo) to install: ${need[*]}" >&2
    exit 1
  }
  sudo=(sudo)
fi
echo "system_deps: installing ${need[*]}"
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
