#!/usr/bin/env bash
# Checks the Prometheus files shipped in examples/prometheus with the real promtool: the
# scrape config (and the rule file it names, found next to it), the alert rules' syntax,
# and the rules' unit tests (each alert fires when it should and stays silent when it
# should not). Exits non-zero on the first failure.
#
#   tests/prometheus_rules.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(tests/prometheus.sh dir)
promtool=$bin/promtool
dir=examples/prometheus

"$promtool" check config "$dir/prometheus.yml"
"$promtool" check rules "$dir/myjob.rules.yml"
"$promtool" test rules "$dir/myjob.rules.test.yml"
