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

# worker_account USER PASSWORD: the least a worker needs on $DB, the README's "Install for
# production" GRANTs read from the README itself, for USER@127.0.0.1 (created afresh).
worker_account() {
  local grants
  grants=$(sed -n 's/^ *\(GRANT .*;\)$/\1/p' "$HERE/../../README.md" \
    | sed "s/ app\./ $DB./; s/'myjob'@'10.0.0.%'/'$1'@'127.0.0.1'/")
  [ "$(grep -c '^GRANT' <<<"$grants")" -ge 8 ] || die "the README's GRANTs: $grants"
  mariadb <<SQL_END
DROP USER IF EXISTS '$1'@'127.0.0.1';
CREATE USER '$1'@'127.0.0.1' IDENTIFIED BY '$2';
$grants
SQL_END
}
