#!/usr/bin/env bash
# Item 13 of the benchmark: the time from `kill -9` of an instance running 8 jobs to those 8
# running again, under a real systemd (tests/systemd/boot-systemd.sh) with the unit as it
# ships (Restart=on-failure, RestartSec=2) and the reaper at its defaults (stale_after 2 min):
# the restarted instance puts its predecessor's claims back itself. Prints one line per run,
# `heal SECONDS`. Usage: bench/heal.sh PATH/TO/myjob RUNS
set -euo pipefail
TOP=$(cd "$(dirname "$0")/.." && pwd)
SD="$TOP/tests/systemd"
BIN=${1:?usage: heal.sh PATH/TO/myjob RUNS}
RUNS=${2:-3}
DB=myjob_bench_heal
SQL() { mariadb "$DB" -N -B -e "$1"; }
sd() { "$SD/run-in-systemd.sh" "$@"; }
count() { SQL "SELECT COUNT(*) FROM myjob_jobs WHERE $1"; }
# Waits up to $1 s, in steps of 50 ms, for a count of $2 rows where $3.
wait_count() {
  local i
  for i in $(seq 1 $(($1 * 20))); do [ "$(count "$3")" = "$2" ] && return 0; sleep 0.05; done
  echo "heal.sh: not $2 rows where $3 after $1 s" >&2; return 1
}

"$SD/boot-systemd.sh" up >/dev/null
R=$("$SD/boot-systemd.sh" rootfs)
trap '"$SD/boot-systemd.sh" down >/dev/null' EXIT
sd systemctl stop 'myjob@*' >/dev/null 2>&1 || true
install -m 755 "$BIN" "$R/usr/bin/myjob"
install -m 644 "$TOP/systemd/myjob@.service" "$R/etc/systemd/system/myjob@.service"
rm -rf "$R"/etc/systemd/system/myjob@*.service.d
sd sh -c 'id myjob >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin myjob'
install -d -m 750 "$R/etc/myjob"
cat > "$R/etc/myjob/myjob.toml" <<EOF_C
[database]
url = "mysql://myjob_bench_heal@127.0.0.1:3306/$DB"
password_file = "/etc/myjob/db-password"

[worker]
concurrency = 8
# The stop after each run releases the jobs at once.
shutdown_timeout = "1s"

[[queue]]
name = "default"
command = ["/bin/sleep", "60"]
EOF_C
PW=heal-$RANDOM$RANDOM
printf '%s\n' "$PW" > "$R/etc/myjob/db-password"
sd sh -c 'chown -R root:myjob /etc/myjob && chmod 640 /etc/myjob/*'
sd systemctl daemon-reload

for run in $(seq 1 "$RUNS"); do
  mariadb -e "DROP DATABASE IF EXISTS $DB; CREATE DATABASE $DB"
  admin=$(mktemp)
  printf '[database]\nurl = "mysql://root@localhost/%s?socket=/run/mysqld/mysqld.sock"\n' "$DB" > "$admin"
  "$BIN" --config "$admin" migrate >/dev/null
  rm -f "$admin"
  mariadb <<SQL_END
DROP USER IF EXISTS 'myjob_bench_heal'@'127.0.0.1';
CREATE USER 'myjob_bench_heal'@'127.0.0.1' IDENTIFIED BY '$PW';
GRANT ALL ON $DB.* TO 'myjob_bench_heal'@'127.0.0.1';
GRANT PROCESS ON *.* TO 'myjob_bench_heal'@'127.0.0.1';
SQL_END
  sd systemctl reset-failed 'myjob@1' >/dev/null 2>&1 || true
  sd systemctl start myjob@1
  SQL "INSERT INTO myjob_jobs (queue, payload) SELECT 'default', 'x' FROM seq_1_to_8"
  wait_count 20 8 "status = 'claimed'"
  pid=$(sd systemctl show -p MainPID --value myjob@1)
  start=$(date +%s.%N)
  sd kill -9 "$pid"
  # Running again: claimed anew, by the restarted instance's own start.
  wait_count 60 8 "status = 'claimed' AND suspicion = 1"
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "heal %.2f\n", b - a }'
  sd systemctl stop myjob@1
done
mariadb -e "DROP DATABASE IF EXISTS $DB; DROP USER IF EXISTS 'myjob_bench_heal'@'127.0.0.1'"
