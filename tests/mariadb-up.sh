#!/usr/bin/env bash
# Makes sure the machine's MariaDB answers on 127.0.0.1:3306: installs it with apt-get when it
# is missing, starts it when it is stopped, and creates the test account `myjob_test`
# (password `myjob_test`) and the database `myjob_dev` that config/local.toml points at.
# Needs root. The same as `tests/db-server.sh up mariadb10`.
exec "$(dirname "$0")/db-server.sh" up mariadb10
