#!/usr/bin/env bash
# The MySQL-family servers the suite runs against, each a real server on a port of its own:
#
#   name        server                                  port(s)      how it runs
#   mariadb10   MariaDB 10.11, the machine's own        3306         Debian's package on this machine
#   mariadb11   MariaDB 11.8, with TLS (a test CA)      3308         Debian trixie's package, in a chroot
#   mysql       MySQL 9.7, TLS on by default            3307         Debian sid's package, in a chroot
#   galera      3 MariaDB 11.8 nodes, Galera 4          3311-3313    the mariadb11 root, in a chroot
#   replicas    MariaDB 11.8 primary + replica          3321-3322    the mariadb11 root, in a chroot
#
#   tests/db-server.sh up NAME        start it (first time: debootstrap, ~1 min and ~1 GB each)
#   tests/db-server.sh down NAME      stop it (its data is kept); reset NAME also removes the data
#   tests/db-server.sh remove NAME    stop it and delete its root filesystem (mariadb11, galera and replicas share one)
#   tests/db-server.sh stop NAME [N]  SIGTERM by its pid file (galera: node N, replicas: server N), wait for the exit
#   tests/db-server.sh kill NAME [N]  SIGKILL by its pid file, wait for the exit
#   tests/db-server.sh url NAME [N]   the test account's url: mysql://myjob_test:myjob_test@127.0.0.1:PORT
#   tests/db-server.sh ca NAME        the CA file that signed the server's certificate (mariadb11, mysql)
#   tests/db-server.sh status         which are up
#
# Every `up` makes sure of the test account `myjob_test` (password `myjob_test`, every privilege),
# which the tests use; on MySQL it is a caching_sha2_password account, MySQL's default. The pid
# file of each server is how a test stops the right one: two of them are processes named mariadbd.
# replicas: server 1 (3321) is the primary, server 2 (3322) its semi-synchronous replica by GTID;
# `up` rebuilds the pair from nothing whenever it is not exactly that (a test switched roles or
# killed one).
# Needs root. DBS_DIR (default /var/tmp/myjob-db-servers) holds the root filesystems and logs.
set -euo pipefail
DBS_DIR=${DBS_DIR:-/var/tmp/myjob-db-servers}
# The Debian archive apt already uses on this machine, unless DBS_MIRROR names another.
apt_mirror() {
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}'
    cat /etc/apt/sources.list 2>/dev/null | awk '$1 == "deb" {print ($2 ~ /^\[/ ? $3 : $2)}'; } \
    | grep -v -- '-security' | head -1 || true
}
MIRROR=${DBS_MIRROR:-$(apt_mirror)}

say() { echo "db-server: $*" >&2; }

spec() { # name -> suite package port daemon
  case "$1" in
    mysql) echo "sid mysql-server 3307 mysqld" ;;
    mariadb11) echo "trixie mariadb-server 3308 mariadbd" ;;
    *) say "unknown server '$1' (mariadb10, mariadb11, mysql, galera or replicas)"; exit 64 ;;
  esac
}

cli() { command -v mariadb || command -v mysql; }
answers() { "$(cli)" -h127.0.0.1 -P"$1" -uroot -e 'SELECT 1' >/dev/null 2>&1; }
sql() { local port=$1; shift; "$(cli)" -h127.0.0.1 -P"$port" -uroot "$@"; }
pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# The account the tests use, with every privilege, reachable over TCP from 127.0.0.1.
test_account() { # port
  sql "$1" <<'SQL'
CREATE USER IF NOT EXISTS 'myjob_test'@'%' IDENTIFIED BY 'myjob_test';
GRANT ALL PRIVILEGES ON *.* TO 'myjob_test'@'%' WITH GRANT OPTION;
SQL
}

# A fresh MariaDB data directory has anonymous accounts, which would shadow 'user'@'%' for
# connections from 127.0.0.1: drop them, as mariadb-secure-installation does.
drop_anonymous() { # port
  sql "$1" -N -e "SELECT CONCAT('DROP USER IF EXISTS ''''@''', Host, ''';') FROM mysql.user WHERE User = ''" \
    | sql "$1"
}

# --- mariadb10: the machine's own server ----------------------------------------------------
mariadb10_pidfile() { echo /run/mysqld/mysqld.pid; }
mariadb10_up() {
  if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
    say "installing mariadb-server"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client >/dev/null
  fi
  if ! mariadb-admin ping >/dev/null 2>&1; then
    say "starting mariadbd"
    install -d -o mysql -g mysql /run/mysqld
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 1 100); do
      mariadb-admin ping >/dev/null 2>&1 && break
      sleep 0.2
    done
    mariadb-admin ping >/dev/null 2>&1 || { say "mariadbd did not come up"; exit 69; }
  fi
  # Over the unix socket as the system's root, which a fresh install allows (unix_socket auth).
  # config/local.toml points at myjob_dev.
  mariadb <<'SQL'
CREATE USER IF NOT EXISTS 'myjob_test'@'localhost' IDENTIFIED BY 'myjob_test';
CREATE USER IF NOT EXISTS 'myjob_test'@'127.0.0.1' IDENTIFIED BY 'myjob_test';
GRANT ALL PRIVILEGES ON *.* TO 'myjob_test'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'myjob_test'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS myjob_dev;
SQL
  say "mariadb10: up on 127.0.0.1:3306 ($(mariadb -N -e 'SELECT VERSION()')); test account myjob_test has every privilege"
}

# --- a test CA for mariadb11 ----------------------------------------------------------------
# A CA and a server certificate for 127.0.0.1 and localhost, made once with openssl.
tls_dir() { echo "$DBS_DIR/tls"; }
make_tls() {
  local d; d=$(tls_dir)
  [ -s "$d/server-cert.pem" ] && return 0
  command -v openssl >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=myjob test CA" \
    -keyout "$d/ca-key.pem" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$d/server-key.pem" -out "$d/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/ext.cnf"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca-key.pem" -CAcreateserial \
    -days 3650 -extfile "$d/ext.cnf" -out "$d/server-cert.pem" 2>/dev/null
  rm -f "$d/server.csr" "$d/ext.cnf"
}

# --- mysql and mariadb11: Debian root filesystems, started with chroot ----------------------
root_of() { echo "$DBS_DIR/$1/rootfs"; }
chroot_pidfile() { echo "$(root_of "$1")/run/mysqld/test.pid"; }
chroot_up() {
  read -r suite pkg port daemon < <(spec "$1")
  local root data=/var/lib/mysql-test
  root=$(root_of "$1")
  if ! answers "$port"; then
    if [ ! -x "$root/usr/sbin/$daemon" ]; then
      command -v debootstrap >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
      mkdir -p "$DBS_DIR/$1"
      say "$1: debootstrap $suite with $pkg into $root (log: $DBS_DIR/$1/debootstrap.log)"
      debootstrap --variant=minbase --include="$pkg" "$suite" "$root" "$MIRROR" >"$DBS_DIR/$1/debootstrap.log" 2>&1 \
        || { tail -5 "$DBS_DIR/$1/debootstrap.log" >&2; exit 1; }
    fi
    mountpoint -q "$root/proc" || mount --bind /proc "$root/proc"
    mkdir -p "$root/run/mysqld" "$root$data"
    chroot "$root" chown mysql:mysql /run/mysqld "$data"
    if [ -z "$(ls -A "$root$data")" ]; then
      case "$1" in
        mysql) chroot "$root" mysqld --initialize-insecure --user=mysql --datadir="$data" >"$DBS_DIR/$1/init.log" 2>&1 ;;
        mariadb11) chroot "$root" mariadb-install-db --force --user=mysql --datadir="$data" \
                     --auth-root-authentication-method=normal >"$DBS_DIR/$1/init.log" 2>&1 ;;
      esac || { tail -5 "$DBS_DIR/$1/init.log" >&2; exit 1; }
    fi
    local extra=()
    case "$1" in
      mysql) extra=(--mysqlx=OFF) ;;
      mariadb11)
        make_tls
        mkdir -p "$root/etc/mysql/tls"
        cp "$(tls_dir)"/{ca.pem,server-cert.pem,server-key.pem} "$root/etc/mysql/tls/"
        chroot "$root" chown -R mysql:mysql /etc/mysql/tls
        extra=(--ssl-ca=/etc/mysql/tls/ca.pem --ssl-cert=/etc/mysql/tls/server-cert.pem
               --ssl-key=/etc/mysql/tls/server-key.pem) ;;
    esac
    setsid chroot "$root" "$daemon" --user=mysql --datadir="$data" --port="$port" \
      --bind-address=127.0.0.1 --socket=/run/mysqld/test.sock --pid-file=/run/mysqld/test.pid \
      "${extra[@]}" >>"$DBS_DIR/$1/server.log" 2>&1 < /dev/null &
    for _ in $(seq 1 120); do answers "$port" && break; sleep 0.5; done
    answers "$port" || { tail -5 "$DBS_DIR/$1/server.log" >&2; say "$1: did not answer on 127.0.0.1:$port"; exit 1; }
    [ "$1" = mariadb11 ] && drop_anonymous "$port"
  fi
  test_account "$port"
  say "$1: up on 127.0.0.1:$port ($(sql "$port" -N -e 'SELECT VERSION()'))"
}

# --- galera: three MariaDB 11.8 nodes from the mariadb11 root filesystem --------------------
# Node N listens on 331N (SQL), 45N7 (group), 45N8 (IST), 44N4 (SST by rsync); data in
# /var/lib/galera-N, pid file /run/mysqld/galera-N.pid inside the root filesystem.
galera_pidfile() { echo "$(root_of mariadb11)/run/mysqld/galera-$1.pid"; }
galera_node_up() { # N [--wsrep-new-cluster]
  local root start=() pos; root=$(root_of mariadb11)
  # A node that was killed left no position in grastate.dat; without one it asks for a whole
  # copy of the data (SST), which holds a donor's writes while it runs. Its position is in
  # InnoDB: recovered as the distribution's galera_recovery does, the node catches up from
  # the others' write-set cache instead (IST).
  if [ -z "${2:-}" ] && grep -q '^seqno: *-1' "$root/var/lib/galera-$1/grastate.dat" 2>/dev/null; then
    chroot "$root" mariadbd --defaults-file=/etc/mysql/galera-$1.cnf --user=mysql --wsrep-recover \
      --log-error=/tmp/wsrep-recover-$1.log < /dev/null >/dev/null 2>&1 || true
    pos=$(sed -n 's/.*WSREP: Recovered position: *\([0-9a-f-]*:[0-9-]*\).*/\1/p' \
      "$root/tmp/wsrep-recover-$1.log" 2>/dev/null | tail -1)
    [ -n "$pos" ] && start=(--wsrep-start-position="$pos")
    cat "$root/tmp/wsrep-recover-$1.log" >>"$DBS_DIR/galera/node$1.log" 2>/dev/null || true
  fi
  setsid chroot "$root" mariadbd --defaults-file=/etc/mysql/galera-$1.cnf --user=mysql ${2:-} \
    "${start[@]}" >>"$DBS_DIR/galera/node$1.log" 2>&1 < /dev/null &
  for _ in $(seq 1 480); do
    [ "$(sql 331$1 -N -e "SHOW STATUS LIKE 'wsrep_local_state_comment'" 2>/dev/null | cut -f2)" = Synced ] && return 0
    sleep 0.5
  done
  tail -20 "$DBS_DIR/galera/node$1.log" >&2; say "galera: node $1 did not reach Synced in 240 s"; exit 1
}
galera_up() {
  local root n up=0
  [ -x "$(root_of mariadb11)/usr/sbin/mariadbd" ] || chroot_up mariadb11
  root=$(root_of mariadb11)
  if [ ! -e "$root/usr/lib/galera/libgalera_smm.so" ] || [ ! -x "$root/usr/bin/rsync" ]; then
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    chroot "$root" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 rsync' \
      >"$DBS_DIR/galera-install.log" 2>&1 || { tail -5 "$DBS_DIR/galera-install.log" >&2; exit 1; }
  fi
  mountpoint -q "$root/proc" || mount --bind /proc "$root/proc"
  mkdir -p "$DBS_DIR/galera" "$root/run/mysqld"; chroot "$root" chown mysql:mysql /run/mysqld
  for n in 1 2 3; do
    cat >"$root/etc/mysql/galera-$n.cnf" <<CNF
[mysqld]
datadir=/var/lib/galera-$n
port=331$n
socket=/run/mysqld/galera-$n.sock
pid-file=/run/mysqld/galera-$n.pid
bind-address=127.0.0.1
binlog_format=ROW
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=128M
wsrep_on=ON
wsrep_provider=/usr/lib/galera/libgalera_smm.so
wsrep_cluster_name=myjob
wsrep_cluster_address=gcomm://127.0.0.1:4517,127.0.0.1:4527,127.0.0.1:4537
wsrep_node_address=127.0.0.1:45${n}7
wsrep_node_name=node$n
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:45${n}7;ist.recv_addr=127.0.0.1:45${n}8"
wsrep_sst_receive_address=127.0.0.1:44${n}4
wsrep_sst_method=rsync
# One undo log page per purge batch (in effect one record). MariaDB 11.8.9's purge, when a
# DDL statement pauses it (each test's migrations, a CREATE TRIGGER, a DROP DATABASE), goes
# round a loop that reopens every table of its batch with indexed virtual columns (myjob_jobs
# has three) and keeps what it allocates until the pause ends; under Galera's isolation of
# DDL on a busy cluster the pause lasts seconds, and a node grew by 500 MB a second until
# the kernel killed it. With one page a batch it holds one table at most: the Galera stage
# that blew a node up ran with every node under 700 MB. Read at a node's start: a node
# already running keeps what it started with (tests/db-server.sh reset galera starts afresh).
innodb_purge_batch_size=1
CNF
    mkdir -p "$root/var/lib/galera-$n"; chroot "$root" chown mysql:mysql "/var/lib/galera-$n"
    if answers 331$n; then up=$((up + 1)); fi
  done
  if [ $up = 0 ]; then
    if [ -z "$(ls -A "$root/var/lib/galera-1")" ]; then
      chroot "$root" mariadb-install-db --defaults-file=/etc/mysql/galera-1.cnf --force --user=mysql \
        --auth-root-authentication-method=normal >"$DBS_DIR/galera/init.log" 2>&1 || { tail -5 "$DBS_DIR/galera/init.log" >&2; exit 1; }
    fi
    # The whole cluster is down: node 1 starts a new one from its own data, whatever its last state.
    if [ -f "$root/var/lib/galera-1/grastate.dat" ]; then
      sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$root/var/lib/galera-1/grastate.dat"
    fi
    galera_node_up 1 --wsrep-new-cluster
    drop_anonymous 3311
  fi
  for n in 1 2 3; do answers 331$n || galera_node_up $n; done
  # Accounts are replicated: one node is enough.
  for n in 1 2 3; do if answers 331$n; then test_account 331$n; break; fi; done
  say "galera: 3 nodes up on 127.0.0.1:3311-3313 (cluster size $(sql 3311 -N -e "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2))"
}

# --- replicas: a MariaDB 11.8 primary and its replica, from the mariadb11 root filesystem ---
# Server N listens on 332N; data in /var/lib/replica-N, pid file /run/mysqld/replica-N.pid
# inside the root filesystem. Both are configured so that either can be the primary or the
# replica (semi-synchronous, AFTER_SYNC, on server 1); roles are set at run time by `up`.
replicas_pidfile() { echo "$(root_of mariadb11)/run/mysqld/replica-$1.pid"; }
replicas_healthy() { # server 2 replicates from server 1, which is writable and replicates nothing
  local st1 st2
  answers 3321 && answers 3322 || return 1
  st2=$(sql 3322 -e 'SHOW SLAVE STATUS\G' 2>/dev/null) || return 1
  st1=$(sql 3321 -e 'SHOW SLAVE STATUS\G' 2>/dev/null) || return 1
  grep -q '^ *Slave_IO_Running: Yes$' <<<"$st2" && grep -q '^ *Slave_SQL_Running: Yes$' <<<"$st2" \
    && grep -q '^ *Master_Port: 3321$' <<<"$st2" || return 1
  ! grep -q '^ *Slave_\(IO\|SQL\)_Running: Yes$' <<<"$st1" || return 1
  [ "$(sql 3321 -N -e 'SELECT @@global.read_only' 2>/dev/null)" = 0 ] \
    && [ "$(sql 3322 -N -e 'SELECT @@global.read_only' 2>/dev/null)" = 1 ]
}
replicas_stop() { # N: SIGTERM by its pid file, SIGKILL if it has not exited in 30 s
  local pid cmd
  pid=$(cat "$(replicas_pidfile "$1")" 2>/dev/null) || return 0
  pid_alive "$pid" || return 0
  # Only that server: a pid file left by a killed one may name a pid since reused.
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 0
  [[ $cmd == *"replica-$1.cnf"* ]] || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do pid_alive "$pid" || return 0; sleep 0.25; done
  say "replicas: server $1 (pid $pid) still running 30 s after SIGTERM: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do pid_alive "$pid" || return 0; sleep 0.25; done
  say "replicas: server $1 (pid $pid) did not exit"; exit 1
}
replicas_server_up() { # N
  local root; root=$(root_of mariadb11)
  setsid chroot "$root" mariadbd --defaults-file="/etc/mysql/replica-$1.cnf" --user=mysql \
    >>"$DBS_DIR/replicas/node$1.log" 2>&1 < /dev/null &
}
replicas_wait() { # N
  for _ in $(seq 1 120); do answers "332$1" && return 0; sleep 0.25; done
  tail -20 "$DBS_DIR/replicas/node$1.log" >&2; say "replicas: server $1 did not answer on 127.0.0.1:332$1 in 30 s"; exit 1
}
replicas_up() {
  local root n st master
  [ -x "$(root_of mariadb11)/usr/sbin/mariadbd" ] || chroot_up mariadb11
  root=$(root_of mariadb11)
  mountpoint -q "$root/proc" || mount --bind /proc "$root/proc"
  mkdir -p "$DBS_DIR/replicas" "$root/run/mysqld"; chroot "$root" chown mysql:mysql /run/mysqld
  for n in 1 2; do
    # The primary's side of semi-synchronous replication on server 1 only; the replica's on
    # both, so that either can be the replica after a switch of roles.
    master=
    [ "$n" = 1 ] && master='rpl_semi_sync_master_enabled=ON
rpl_semi_sync_master_wait_point=AFTER_SYNC
rpl_semi_sync_master_timeout=10000'
    cat >"$root/etc/mysql/replica-$n.cnf" <<CNF
[mysqld]
datadir=/var/lib/replica-$n
port=332$n
socket=/run/mysqld/replica-$n.sock
pid-file=/run/mysqld/replica-$n.pid
bind-address=127.0.0.1
skip-name-resolve
server_id=$n
log_bin=mariadb-bin
relay_log=relay-bin
binlog_format=ROW
log_slave_updates=ON
gtid_strict_mode=ON
innodb_buffer_pool_size=128M
rpl_semi_sync_slave_enabled=ON
$master
CNF
  done
  if replicas_healthy; then
    test_account 3321 # replicated to server 2
    say "replicas: up on 127.0.0.1:3321 (primary) and 127.0.0.1:3322 (replica), $(sql 3321 -N -e 'SELECT VERSION()')"
    return 0
  fi
  say "replicas: (re)building the pair (log: $DBS_DIR/replicas/node{1,2}.log)"
  for n in 2 1; do replicas_stop $n; done
  # Both data directories are made before either server starts: a starting server deletes
  # every #sql file in its tmpdir, the root filesystem's /tmp that the other's
  # mariadb-install-db was writing its temporary tables to (a CI run failed so).
  for n in 1 2; do
    if answers 332$n; then say "replicas: something else answers on 127.0.0.1:332$n"; exit 1; fi
    rm -rf "$root/var/lib/replica-$n"
    mkdir -p "$root/var/lib/replica-$n"; chroot "$root" chown mysql:mysql "/var/lib/replica-$n"
    chroot "$root" mariadb-install-db --defaults-file="/etc/mysql/replica-$n.cnf" --force --user=mysql \
      --auth-root-authentication-method=normal >"$DBS_DIR/replicas/init$n.log" 2>&1 \
      || { tail -5 "$DBS_DIR/replicas/init$n.log" >&2; exit 1; }
  done
  for n in 1 2; do replicas_server_up $n; done
  for n in 1 2; do replicas_wait $n; done
  # Server 1's binary log stays empty until server 2 is attached: with no replica, a
  # semi-synchronous primary holds each commit for rpl_semi_sync_master_timeout (10 s).
  # Server 2's own writes are wiped by RESET MASTER: a GTID of its own would break
  # gtid_strict_mode the day it replicates to server 1. The replication account is made on
  # both, unlogged, for either to be the primary.
  drop_anonymous 3322
  test_account 3322
  for n in 1 2; do
    sql 332$n <<'SQL'
SET sql_log_bin=0;
CREATE USER 'repl'@'%' IDENTIFIED BY 'repl';
GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%';
SET sql_log_bin=1;
RESET MASTER;
SQL
  done
  sql 3322 <<'SQL'
SET GLOBAL read_only=ON;
CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=3321, MASTER_USER='repl', MASTER_PASSWORD='repl',
  MASTER_USE_GTID=slave_pos;
START SLAVE;
SQL
  for _ in $(seq 1 120); do replicas_healthy && break; sleep 0.25; done
  if ! replicas_healthy; then
    st=$(sql 3322 -e 'SHOW SLAVE STATUS\G' 2>&1 || true)
    grep -E 'Running|Last_.*Error:' <<<"$st" >&2 || true
    say "replicas: server 2 did not start replicating from server 1 in 30 s"; exit 1
  fi
  # Replicated, acknowledged by server 2 (semi-sync) and awaited there until applied.
  drop_anonymous 3321
  test_account 3321
  if [ "$(sql 3322 -N -e "SELECT MASTER_GTID_WAIT('$(sql 3321 -N -e 'SELECT @@gtid_binlog_pos')', 30)")" != 0 ]; then
    say "replicas: server 2 did not apply server 1's accounts in 30 s"; exit 1
  fi
  say "replicas: up on 127.0.0.1:3321 (primary) and 127.0.0.1:3322 (replica), $(sql 3321 -N -e 'SELECT VERSION()')"
}

# --- stopping by pid file -------------------------------------------------------------------
pidfile() { # name [node]
  case "$1" in
    mariadb10) mariadb10_pidfile ;;
    galera) galera_pidfile "${2:?galera needs a node number}" ;;
    replicas) replicas_pidfile "${2:?replicas needs a server number}" ;;
    *) spec "$1" >/dev/null; chroot_pidfile "$1" ;;
  esac
}
signal_server() { # SIG name [node]: signal the server by its pid file and wait for it to exit
  local sig=$1 pid; shift
  pid=$(cat "$(pidfile "$@")" 2>/dev/null) || { say "$*: no pid file, not running"; return 0; }
  pid_alive "$pid" || return 0
  kill "-$sig" "$pid"
  for _ in $(seq 1 240); do pid_alive "$pid" || return 0; sleep 0.25; done
  say "$*: pid $pid did not exit"; exit 1
}

port_of() { # name [node]
  case "$1" in
    mariadb10) echo 3306 ;;
    galera) echo "331${2:-1}" ;;
    replicas) echo "332${2:-1}" ;;
    *) read -r _ _ port _ < <(spec "$1"); echo "$port" ;;
  esac
}

case "${1:-}" in
  up)
    case "${2:?name}" in
      mariadb10) mariadb10_up ;;
      galera) galera_up ;;
      replicas) replicas_up ;;
      *) chroot_up "$2" ;;
    esac ;;
  down)
    case "${2:?name}" in
      galera) for n in 3 2 1; do signal_server TERM galera $n; done ;;
      replicas) for n in 2 1; do signal_server TERM replicas $n; done ;;
      *) signal_server TERM "$2" ;;
    esac
    say "$2: down" ;;
  reset)
    "$0" down "${2:?name}"
    case "$2" in
      mariadb10) say "mariadb10 is the machine's own server: its data is left alone" ;;
      galera) rm -rf "$(root_of mariadb11)"/var/lib/galera-[123]; say "galera: data removed" ;;
      replicas) rm -rf "$(root_of mariadb11)"/var/lib/replica-[12]; say "replicas: data removed" ;;
      *) rm -rf "$(root_of "$2")/var/lib/mysql-test"; say "$2: data removed" ;;
    esac ;;
  remove)
    # Back to a new machine's state: the servers of that root filesystem stopped, its /proc
    # unmounted (rm -rf must never walk into a mount), the whole root filesystem deleted.
    case "${2:?name}" in
      mariadb10) say "mariadb10 is the machine's own server: nothing to remove"; exit 0 ;;
      mysql) "$0" down mysql ;;
      mariadb11 | galera | replicas)
        "$0" down galera; "$0" down replicas; "$0" down mariadb11; set -- remove mariadb11 ;;
    esac
    root=$(root_of "$2")
    if mountpoint -q "$root/proc"; then umount "$root/proc"; fi
    if grep -q " ${DBS_DIR}/$2/" /proc/mounts; then say "$2: something is still mounted under its root"; exit 1; fi
    rm -rf "${DBS_DIR:?}/$2"
    say "$2: root filesystem removed" ;;
  stop) signal_server TERM "${2:?name}" ${3:+"$3"} ;;
  kill) signal_server KILL "${2:?name}" ${3:+"$3"} ;;
  url) echo "mysql://myjob_test:myjob_test@127.0.0.1:$(port_of "${2:?name}" ${3:+"$3"})" ;;
  ca)
    case "${2:?name}" in
      mariadb11) echo "$(tls_dir)/ca.pem" ;;
      mysql) echo "$(root_of mysql)/var/lib/mysql-test/ca.pem" ;;
      *) say "$2 has no test CA"; exit 64 ;;
    esac ;;
  status)
    for n in mariadb10 mysql mariadb11; do
      p=$(port_of $n); if answers "$p"; then echo "$n: up on $p"; else echo "$n: down"; fi
    done
    for n in 1 2 3; do if answers 331$n; then echo "galera node $n: up on 331$n"; else echo "galera node $n: down"; fi; done
    for n in 1 2; do if answers 332$n; then echo "replicas server $n: up on 332$n"; else echo "replicas server $n: down"; fi; done ;;
  *) sed -n '2,26p' "$0"; exit 64 ;;
esac
