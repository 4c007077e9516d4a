#!/usr/bin/env bash
# Makes sure a MariaDB server answers on 127.0.0.1:3306 for the tests: installs it with
# apt-get when it is missing, starts it when it is stopped, and creates the test account
# `myjob_test` (password `myjob_test`), which the tests use, and the database `myjob_dev`
# that config/local.toml points at. Needs root.
set -euo pipefail

say() { echo "mariadb-up: $*" >&2; }

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
mariadb <<'SQL'
CREATE USER IF NOT EXISTS 'myjob_test'@'localhost' IDENTIFIED BY 'myjob_test';
CREATE USER IF NOT EXISTS 'myjob_test'@'127.0.0.1' IDENTIFIED BY 'myjob_test';
GRANT ALL PRIVILEGES ON *.* TO 'myjob_test'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'myjob_test'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS myjob_dev;
SQL
say "ready on 127.0.0.1:3306"
