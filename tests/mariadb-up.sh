#!/usr/bin/env bash
# Makes sure the machine's MariaDB answers on 127.0.0.1:3306, for trying myjob and for the
# tests: installs it with apt-get when it is missing, starts it when it is stopped, creates
# the database `myjob_dev` that config/local.toml points at, and the test account
# `myjob_test` (password `myjob_test`) with every privilege on this server, from 127.0.0.1
# and localhost: the tests create databases and accounts of their own. Do not run it on a
# server that holds data you care about. config/local.toml holds that password, so it is
# made readable by its owner only (myjob warns of a password every user may read).
# Needs root. The same as `tests/db-server.sh up mariadb10`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/db-server.sh" up mariadb10
chmod 600 "$here/../config/local.toml"
echo "mariadb-up: myjob_dev and the account myjob_test (every privilege) are ready; config/local.toml is 0600"
