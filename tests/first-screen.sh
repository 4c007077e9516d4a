#!/usr/bin/env bash
# The README's first screen, as a newcomer runs it: its commands as the README gives them
# (read out of README.md, not copied here), on a fresh myjob_dev. The worker's command runs
# in the background; once it is ready, the enqueue command; then Ctrl-C (SIGINT to the
# worker's process group). Every line of the README's console block that follows the
# enqueue (timestamps aside) must be a line of what the worker printed, in that order.
# Run as root, from anywhere; tests/run runs it after the release build.
set -euo pipefail
cd "$(dirname "$0")/.."

# The lines of every block of the README fenced as ```$1, blocks one after another.
block() { awk -v fence="\`\`\`$1" '/^```/ { if (inside) { inside = 0; next } if ($0 == fence) { inside = 1; next } } inside' README.md; }
worker=$(block sh | grep -m1 '^tests/mariadb-up.sh ' || true)
enqueue=$(block sh | grep -m1 '^mariadb myjob_dev ' || true)
# The console block that shows the job done: each block's lines, blank-separated.
expected=$(awk '/^```console$/ { inside = 1; text = ""; next } /^```$/ && inside { inside = 0; if (text ~ /job done/) { printf "%s", text; exit } next } inside { text = text $0 "\n" }' README.md)
[ -n "$worker" ] || { echo "first-screen: the README has no worker command (tests/mariadb-up.sh …)"; exit 1; }
[ -n "$enqueue" ] || { echo "first-screen: the README has no enqueue command (mariadb myjob_dev …)"; exit 1; }
[ -n "$expected" ] || { echo "first-screen: the README shows no console block with the job done"; exit 1; }

# A fresh database, as on a new machine (the worker's command creates it again).
if command -v mariadb >/dev/null && mariadb -e 'SELECT 1' >/dev/null 2>&1; then
  mariadb -e 'DROP DATABASE IF EXISTS myjob_dev'
fi
log=$(mktemp)
trap 'kill -KILL -- -"$pid" 2>/dev/null || true; rm -f "$log"' EXIT
echo "first-screen: $worker"
setsid bash -c "$worker" >"$log" 2>&1 </dev/null &
pid=$!
wait_for() { # SECONDS PATTERN: until the log has a line matching PATTERN
  local i
  for i in $(seq 1 $(($1 * 10))); do
    grep -qE "$2" "$log" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "first-screen: no line matching '$2' within $1 s:"; cat "$log"; exit 1
}
# A cold build takes minutes; tests/run has built the release binary already.
wait_for 900 ' INFO ready$'
echo "first-screen: $enqueue"
bash -c "$enqueue"
wait_for 30 ' INFO job done '
kill -INT -- -"$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { echo "first-screen: still running 10 s after Ctrl-C"; cat "$log"; exit 1; }
# The README says it exits 0, and nothing in a first run is worth a warning.
rc=0; wait "$pid" || rc=$?
[ "$rc" = 0 ] || { echo "first-screen: the worker exited $rc after Ctrl-C"; cat "$log"; exit 1; }
if grep -E '^[0-9TZ:.-]+ +(WARN|ERROR) ' "$log"; then
  echo "first-screen: the first screen logged a warning or an error (above)"; exit 1
fi

# The README's lines, the timestamp that starts each log line aside, in order in the log.
strip() { sed -E 's/^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z +//'; }
got=$(strip <"$log")
at=0
while IFS= read -r want; do
  [ -n "$want" ] || continue
  case "$want" in '$ '* | '^C'*) continue ;; esac
  want=$(strip <<<"$want")
  line=$(awk -v from="$at" -v want="$want" 'NR > from && $0 == want { print NR; exit }' <<<"$got")
  [ -n "$line" ] || { echo "first-screen: the README shows a line the worker did not print (in this order):"; echo "  $want"; echo "what it printed:"; cat "$log"; exit 1; }
  at=$line
done <<<"$expected"
echo "first-screen: the README's first screen ran as written: $(grep -c . <<<"$expected") lines shown, all printed"
