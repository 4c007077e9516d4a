#!/usr/bin/env bash
# A real Prometheus and its promtool for the suite, from Debian's own package, extracted (no
# service is installed or started): prints the directory holding `prometheus` and `promtool`.
# The package comes from the machine's apt sources; it is fetched once and kept.
#
#   tests/prometheus.sh dir     the directory of the two binaries (fetched if missing)
set -euo pipefail
root=/var/tmp/myjob-prometheus
bin=$root/root/usr/bin
case "${1:-dir}" in
  dir)
    mkdir -p "$root"
    # The tests run in parallel and each asks for it: one fetches, the others wait for it
    # (two at once removed each other's files on a fresh machine).
    exec 9>"$root/.lock"
    flock 9
    if [ ! -x "$bin/prometheus" ] || [ ! -x "$bin/promtool" ]; then
      cd "$root"
      rm -f prometheus_*.deb
      apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }
      rm -rf root
      dpkg-deb -x prometheus_*.deb root
      rm -f prometheus_*.deb
    fi
    echo "$bin"
    ;;
  *) echo "usage: tests/prometheus.sh dir" >&2; exit 64 ;;
esac
