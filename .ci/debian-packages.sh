#!/usr/bin/env bash
# The Debian packages the real-part tests run (Prometheus, Alertmanager, Chromium, PostgreSQL, Slurm + slurmdbd + MariaDB, munge).
# As root: installs the missing ones, with a policy-rc.d that keeps their services from starting (the tests
# start their own daemons on loopback ports and stop them by PID). Otherwise: one line saying what to install.
set -euo pipefail

need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Chromium only recommends fonts; without one the dashboard screenshots show no text.
[ -d /usr/share/fonts/truetype/dejavu ] || need+=(fonts-dejavu-core)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
# QOS (tidal tiers) live in Slurm's accounting database: slurmdbd on a private MariaDB
command -v slurmdbd >/dev/null 2>&1 || need+=(slurmdbd)
command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "real-part tests need Debian packages: sudo apt-get install --no-install-recommends ${need[*]}" >&2
  exit 0
fi
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\n# Vigil tests: installed services stay stopped; tests start their own.\nexit 101\n' \
    > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
