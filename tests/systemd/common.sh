# What e2e.sh and package.sh share, sourced after they set HERE and DB: the container, the
# checks and their tally, and the database account a worker runs as.
SQL() { mariadb "$DB" -N -B -e "$1"; }
sd() { "$HERE/run-in-systemd.sh" "$@"; }
pass=0 fail=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
wait_for() { local t=$1; shift; local i; for i in $(seq 1 $((t * 10))); do "$@" && return 0; sleep 0.1; done; return 1; }
prop() { sd systemctl show -p "$2" --value "$1"; }
count() { SQL "SELECT COUNT(*) FROM myjob_jobs WHERE $1"; }
count_is() { [ "$(count "$1")" = "$2" ]; }
die() { echo "FAIL: setup: $*"; echo "$pass passed, $((fail + 1)) failed"; exit 1; }

# worker_account USER PASSWORD: the least a worker needs on $DB, as the README's "Install for
# production" gives it, for USER@127.0.0.1 (created afresh).
worker_account() {
  mariadb <<SQL_END
DROP USER IF EXISTS '$1'@'127.0.0.1';
CREATE USER '$1'@'127.0.0.1' IDENTIFIED BY '$2';
GRANT SELECT, INSERT, UPDATE, DELETE ON $DB.myjob_jobs TO '$1'@'127.0.0.1';
GRANT SELECT, INSERT, UPDATE, DELETE ON $DB.myjob_servers TO '$1'@'127.0.0.1';
GRANT SELECT ON $DB.myjob_schema_migrations TO '$1'@'127.0.0.1';
GRANT SELECT, INSERT, UPDATE ON $DB.myjob_queues TO '$1'@'127.0.0.1';
GRANT SELECT, INSERT, UPDATE, DELETE ON $DB.myjob_schedule_ticks TO '$1'@'127.0.0.1';
GRANT PROCESS ON *.* TO '$1'@'127.0.0.1';
SQL_END
}
