#!/usr/bin/env bash
# The Debian package under a real systemd (booted by boot-systemd.sh), as an admin uses it:
# dpkg -i, the config edited, two instances started, jobs done by PHP, Python, Node, shell
# and Perl handlers under the shipped unit and under docs/systemd.md's drop-ins, an upgrade that
# restarts the instances, dpkg -r, dpkg -P. Usage: package.sh PACKAGE.deb NEWER.deb (the same
# package with a higher version). Prints 'N passed, N failed'.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
DEB=${1:?usage: package.sh PACKAGE.deb NEWER.deb}
NEWER=${2:?usage: package.sh PACKAGE.deb NEWER.deb}
DB=myjob_pkg_$(date +%s)
. "$HERE/common.sh"

"$HERE/boot-systemd.sh" up || { echo "0 passed, 1 failed"; exit 1; }
R=$("$HERE/boot-systemd.sh" rootfs)
T0=$(date +%s)
trap '"$HERE/boot-systemd.sh" down' EXIT

# ---- the handlers' languages, and man, in the container (once: the rootfs is kept)
if ! sd sh -c 'command -v php && command -v python3 && command -v node && command -v man && command -v zsh && command -v fish && test -d /usr/share/bash-completion' >/dev/null; then
  echo "package: installing php-cli, python3, nodejs, man-db and the shells' completion in the container" >&2
  sd sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends php-cli python3 nodejs man-db bash-completion zsh fish >/dev/null' \
    || die "cannot install the handlers' languages in the container"
fi

# ---- a machine that never had myjob: what earlier tests installed by hand goes
sd systemctl stop 'myjob@*' >/dev/null 2>&1
sd dpkg -P myjob >/dev/null 2>&1
# (and man's cache of formatted pages: an earlier run's package had the same timestamps)
rm -rf "$R"/etc/systemd/system/myjob@* "$R/etc/myjob" "$R/usr/bin/myjob" "$R"/var/cache/man/*
sd sh -c 'userdel myjob 2>/dev/null; groupdel myjob 2>/dev/null; systemctl daemon-reload'
sd id myjob >/dev/null 2>&1 && die "the myjob user is still there"

# ---- dpkg -i: the user, the modes, the unit disabled, nothing running
cp "$DEB" "$R/root/myjob.deb" && cp "$NEWER" "$R/root/myjob-newer.deb" || die "cannot copy the packages"
check "dpkg -i" sd dpkg -i /root/myjob.deb
check "the myjob system user and group, no shell, no home" \
  test "$(sd getent passwd myjob | cut -d: -f6,7)/$(sd id -gn myjob)" = "/nonexistent:/usr/sbin/nologin/myjob"
check "the myjob user is a system user (uid < 1000)" test "$(sd id -u myjob)" -lt 1000
check "/etc/myjob is 750 root:myjob" test "$(sd stat -c '%a %U %G' /etc/myjob)" = "750 root myjob"
check "/etc/myjob/myjob.toml is 640 root:myjob" test "$(sd stat -c '%a %U %G' /etc/myjob/myjob.toml)" = "640 root myjob"
check "/etc/myjob/myjob.toml is a conffile" grep -qx '/etc/myjob/myjob.toml' "$R/var/lib/dpkg/info/myjob.conffiles"
check "the unit in /usr/lib/systemd/system, disabled" test "$(sd systemctl is-enabled myjob@1.service)" = disabled
check "no instance running after the install" test -z "$(sd systemctl list-units --no-legend --state=active 'myjob@*')"
out=$(sd systemd-analyze verify myjob@.service 2>&1); rc=$?
check "systemd-analyze verify myjob@.service prints nothing (man pages found)" test -z "$out" -a "$rc" = 0
[ -z "$out" ] || echo "$out" | sed 's/^/    /'
exposure=$(sd systemd-analyze security --no-pager myjob@1.service | sed -n 's/.*Overall exposure level for myjob@1.service: \([0-9.]*\).*/\1/p')
echo "    systemd-analyze security myjob@1.service: exposure $exposure"
check "exposure of the shipped unit <= 2.0" awk -v e="$exposure" 'BEGIN { exit !(e != "" && e <= 2.0) }'
check "man myjob" sd sh -c 'man myjob 2>/dev/null | grep -q "myjob-run(1)"'
pages=$(ls "$TOP"/docs/*.md | wc -l)
check "the README and the $pages pages of docs/ under /usr/share/doc/myjob" sd sh -c "test -f /usr/share/doc/myjob/README.md && test \$(ls /usr/share/doc/myjob/docs/*.md | wc -l) = $pages"
check "man myjob-run" sd sh -c 'man myjob-run 2>/dev/null | grep -q -- "--instance"'
check "man myjob.toml: every table of the config" sd sh -c 'p=$(man 5 myjob.toml 2>/dev/null); for t in "[database]" "[worker]" "[reaper]" "[retention]" "[metrics]" "[[queue]]" "[[schedule]]"; do echo "$p" | grep -qxF "$t" || exit 1; done'
check "the bash completion loads and completes subcommands" \
  sd bash -c 'source /usr/share/bash-completion/bash_completion; source /usr/share/bash-completion/completions/myjob; COMP_WORDS=(myjob re); COMP_CWORD=1; COMP_LINE="myjob re"; COMP_POINT=8; _myjob myjob re myjob; printf "%s\n" "${COMPREPLY[@]}" | sort | tr "\n" " " | grep -qx "resume retry "'
check "the fish completion completes subcommands" test "$(sd fish -c 'complete -C "myjob re"' | cut -f1 | tr '\n' ' ')" = "resume retry "
check "the zsh completion is found by compinit" \
  test "$(sd zsh -fc 'fpath=(/usr/share/zsh/vendor-completions $fpath); autoload -U compinit; compinit -u -D; print -r -- $_comps[myjob]')" = _myjob
check "myjob --version" test "$(sd myjob --version)" = "myjob $(grep -m1 '^version' "$TOP/Cargo.toml" | cut -d'"' -f2)"

# ---- the database, and the config as the admin edits it
PW=pkg-$RANDOM$RANDOM
for old in $(mariadb -N -B -e "SHOW DATABASES LIKE 'myjob\_pkg%'"); do mariadb -e "DROP DATABASE \`$old\`"; done
mariadb -e "CREATE DATABASE $DB" || die "cannot create $DB"
printf '[database]\nurl = "mysql://root@127.0.0.1:3306/%s"\n' "$DB" > "$R/root/admin.toml"
sd myjob --config /root/admin.toml migrate >/dev/null || die "migrate"
worker_account myjob_pkg "$PW" || die "cannot create the worker account"
L=/usr/local/lib/myjob-pkg
install -d -m 755 "$R$L"
rm -rf "$R/var/lib/myjob-pkg"; install -d -m 755 "$R/var/lib/myjob-pkg"; sd chown myjob:myjob /var/lib/myjob-pkg
# Per job, shell.
cat > "$R$L/shell.sh" <<'EOF'
#!/bin/sh
p=$(cat)
case "$p" in sleep:*) sleep "${p#sleep:}" ;; esac
echo "shell $MYJOB_JOB_ID" >> /var/lib/myjob-pkg/runs
EOF
# Persistent, PHP with the helper, starting a child process.
cat > "$R$L/handler.php" <<'EOF'
#!/usr/bin/php
<?php
require '/usr/share/doc/myjob/examples/persistent/myjob.php';
myjob_serve(function (MyjobJob $job) {
    $out = shell_exec('echo child');
    if ($out !== "child\n") throw new MyjobFail('shell_exec gave ' . var_export($out, true));
    file_put_contents('/var/lib/myjob-pkg/runs', "php {$job->id}\n", FILE_APPEND);
});
EOF
# Persistent, Python with the helper, and a pool of processes.
cat > "$R$L/handler.py" <<'EOF'
#!/usr/bin/python3
import multiprocessing, sys
sys.path.insert(0, "/usr/share/doc/myjob/examples/persistent")
import myjob

def handle(job):
    with multiprocessing.Pool(2) as pool:
        if pool.map(abs, [-1, -2]) != [1, 2]:
            raise myjob.Fail("the pool gave a wrong answer")
    with open("/var/lib/myjob-pkg/runs", "a") as runs:
        runs.write(f"python {job.id}\n")

myjob.serve(handle)
EOF
# Persistent, Node, the protocol by hand: os.networkInterfaces() needs AF_NETLINK.
cat > "$R$L/handler.js" <<'EOF'
#!/usr/bin/node
const os = require("os"), fs = require("fs"), cp = require("child_process");
let buf = Buffer.alloc(0), header = null;
process.stdin.on("data", (d) => { buf = Buffer.concat([buf, d]); serve(); });
process.stdout.write("READY\n");
function serve() {
  for (;;) {
    if (!header) {
      const nl = buf.indexOf(10);
      if (nl < 0) return;
      header = buf.subarray(0, nl).toString().split(" ");
      buf = buf.subarray(nl + 1);
    }
    const length = Number(header[5]);
    if (buf.length < length) return;
    const id = header[1];
    buf = buf.subarray(length);
    header = null;
    let answer = "OK";
    try {
      const names = Object.keys(os.networkInterfaces());
      if (!names.includes("lo")) throw new Error("no lo among " + names.join(","));
      cp.execSync("true");
      fs.appendFileSync("/var/lib/myjob-pkg/runs", `node ${id}\n`);
    } catch (e) {
      answer = "FAIL " + String(e.message).replace(/\n/g, " ");
    }
    process.stdout.write(answer + "\n");
  }
}
EOF
# Per job, a system call outside @system-service: EPERM, not a SIGSYS death.
cat > "$R$L/syscall.pl" <<'EOF'
#!/usr/bin/perl
# ptrace(PTRACE_TRACEME), system call 101 on x86_64.
my $r = syscall(101, 0, 0, 0, 0);
my $errno = $! + 0;
print "ptrace=$r errno=$errno\n";
exit($r == -1 && $errno == 1 ? 0 : 65);
EOF
# Per job, a datagram to an address no allow-list has (TEST-NET-3): EPERM under the egress
# allow-list (a TCP connection would wait for its timeout, its SYN dropped).
cat > "$R$L/egress.pl" <<'EOF'
#!/usr/bin/perl
use IO::Socket::INET;
my $s = IO::Socket::INET->new(PeerAddr => "203.0.113.1:9", Proto => "udp");
my $sent = $s && defined $s->send("x");
my $errno = $! + 0;
print "send: ", ($sent ? "sent" : "$! (errno $errno)"), "\n";
exit(!$sent && $errno == 1 ? 0 : 65);
EOF
chmod 755 "$R$L"/*
printf '%s\n' "$PW" > "$R/etc/myjob/db-password"
sd sh -c 'chown root:myjob /etc/myjob/db-password && chmod 640 /etc/myjob/db-password'
cat > "$R/etc/myjob/myjob.toml" <<EOF_C
[database]
url = "mysql://myjob_pkg@127.0.0.1:3306/$DB"
password_file = "/etc/myjob/db-password"

[worker]
concurrency = 4
poll_interval = "200ms"
shutdown_timeout = "5s"

[metrics]
listen = ""

[[queue]]
name = "shell"
command = ["$L/shell.sh"]
max_attempts = 1

[[queue]]
name = "php"
command = ["$L/handler.php"]
persistent = true
max_attempts = 1

[[queue]]
name = "python"
command = ["$L/handler.py"]
persistent = true
max_attempts = 1

[[queue]]
name = "node"
command = ["$L/handler.js"]
persistent = true
max_attempts = 1

[[queue]]
name = "syscall"
command = ["$L/syscall.pl"]
max_attempts = 1

[[queue]]
name = "egress"
command = ["$L/egress.pl"]
max_attempts = 1
EOF_C
cp "$R/etc/myjob/myjob.toml" "$R/root/myjob.toml.edited"
check "myjob check-config on the edited config" sd myjob check-config

# ---- jobs of every handler, under the unit as it is set (run: QUEUES...; waits for all done)
round=0
run_jobs() {
  local q n=3 expect=$1; shift
  round=$((round + 1))
  for q in "$@"; do SQL "INSERT INTO myjob_jobs (queue, payload) SELECT '$q', 'round $round' FROM seq_1_to_$n"; done
  for q in "$@"; do
    if wait_for 30 count_is "queue = '$q' AND payload = 'round $round' AND status = 'done'" $n; then
      ok "$expect: $n $q jobs done"
    else
      bad "$expect: $n $q jobs done"
      SQL "SELECT id, status, last_error FROM myjob_jobs WHERE queue = '$q' AND payload = 'round $round'" | sed 's/^/    /'
    fi
  done
}
arch_queues=(); [ "$(uname -m)" = x86_64 ] && arch_queues=(syscall)
check "systemctl start myjob@1 myjob@2" sd systemctl start myjob@1 myjob@2
run_jobs "the shipped unit" shell php python node "${arch_queues[@]}"
if [ ${#arch_queues[@]} -gt 0 ]; then
  check "the filtered ptrace got EPERM, and the handler went on" \
    grep -q 'ptrace=-1 errno=1' <<<"$(sd journalctl --since="@$T0" -u myjob@1 -u myjob@2 --no-pager -o cat)"
fi

# ---- docs/systemd.md's drop-ins, one at a time, on every instance
dropin() {
  rm -rf "$R/etc/systemd/system/myjob@.service.d"
  if [ $# -gt 0 ]; then
    mkdir -p "$R/etc/systemd/system/myjob@.service.d"
    cp "$TOP/systemd/drop-ins/$1" "$R/etc/systemd/system/myjob@.service.d/"
    [ $# -gt 1 ] && printf '[Service]\n%s\n' "$2" > "$R/etc/systemd/system/myjob@.service.d/90-test.conf"
  fi
  sd systemctl daemon-reload && sd systemctl restart myjob@1 myjob@2
}
check "50-strict.conf (with the handlers' directory listed): restart" dropin 50-strict.conf "ReadWritePaths=/var/lib/myjob-pkg"
strict=$(sd systemd-analyze security --no-pager myjob@1.service | sed -n 's/.*Overall exposure level for myjob@1.service: \([0-9.]*\).*/\1/p')
echo "    exposure with 50-strict.conf: $strict"
check "exposure with 50-strict.conf below the shipped unit's" awk -v s="$strict" -v e="$exposure" 'BEGIN { exit !(s != "" && s < e) }'
run_jobs "50-strict.conf" shell php python node "${arch_queues[@]}"
check "60-egress.conf: restart" dropin 60-egress.conf
run_jobs "60-egress.conf (the database on localhost allowed)" shell php egress
check "60-egress.conf: a datagram to an address not allowed fails with EPERM" \
  grep -q 'send: Operation not permitted (errno 1)' <<<"$(sd journalctl --since="@$T0" -u myjob@1 -u myjob@2 --no-pager -o cat)"
check "70-no-jit.conf: restart" dropin 70-no-jit.conf
run_jobs "70-no-jit.conf" shell python
SQL "INSERT INTO myjob_jobs (queue, payload) VALUES ('node', 'no jit')"
check "70-no-jit.conf: Node cannot start, as its comment says (the job fails)" \
  wait_for 30 count_is "queue = 'node' AND payload = 'no jit' AND status = 'failed' AND last_error LIKE '%did not start%'" 1
check "the shipped unit again" dropin

# ---- an upgrade while the schema does not fit the new binary (here: a database a version
# ahead) leaves the running instances alone, and says why
pids() { echo "$(prop myjob@1 MainPID) $(prop myjob@2 MainPID)"; }
before=$(pids)
SQL "UPDATE myjob_schema_migrations SET version = version + 1000 ORDER BY version DESC LIMIT 1"
out=$(sd dpkg -i /root/myjob-newer.deb 2>&1); rc=$?
check "dpkg -i a newer version, the schema not fitting it" test "$rc" = 0
check "the instances not restarted (same MainPIDs), still active" \
  test "$(pids)" = "$before" -a "$(prop myjob@1 ActiveState)/$(prop myjob@2 ActiveState)" = active/active
grep '^myjob:' <<<"$out" | sed 's/^/    /'
check "dpkg says why, and what to do" grep -q "^myjob: running instances not restarted, they keep the old version: schema: the database is at version [0-9]*, newer than this myjob knows" <<<"$out"
SQL "UPDATE myjob_schema_migrations SET version = version - 1000 ORDER BY version DESC LIMIT 1"
check "the newer version installed" test "$(sd dpkg-query -W -f '${Version}' myjob)" = "$(dpkg-deb -f "$NEWER" Version)"

# ---- with the schema fitting, an upgrade (here the same version again) restarts the running
# instances, each draining its job in flight first; the edited config and its modes kept
in_flight() {
  SQL "INSERT INTO myjob_jobs (queue, payload) VALUES ('shell', 'sleep:3'); SELECT LAST_INSERT_ID()"
}
job=$(in_flight)
wait_for 10 count_is "id = $job AND status = 'claimed'" 1 || bad "job $job was not claimed"
check "dpkg -i the newer version again" sd dpkg -i /root/myjob-newer.deb
after=$(pids)
check "myjob@1 and myjob@2 restarted (new MainPIDs), active" \
  test "${after% *}" != "${before% *}" -a "${after#* }" != "${before#* }" -a "$(prop myjob@1 ActiveState)/$(prop myjob@2 ActiveState)" = active/active
check "the job in flight finished before the restart, in its first attempt" count_is "id = $job AND status = 'done' AND attempts = 1" 1
check "the edited config kept" cmp -s "$R/etc/myjob/myjob.toml" "$R/root/myjob.toml.edited"
check "the statoverrides kept" test "$(sd dpkg-statoverride --list '/etc/myjob*' | sort | tr '\n' ' ')" = "root myjob 640 /etc/myjob/myjob.toml root myjob 750 /etc/myjob "
run_jobs "after the upgrade" shell php

# ---- remove stops them; purge drops the statoverrides, keeps the user and the password
check "systemctl enable myjob@1" sd systemctl enable --quiet myjob@1
job=$(in_flight)
wait_for 10 count_is "id = $job AND status = 'claimed'" 1 || bad "job $job was not claimed"
check "dpkg -r myjob" sd dpkg -r myjob
check "both instances stopped" test "$(prop myjob@1 ActiveState)/$(prop myjob@2 ActiveState)" = inactive/inactive
check "the job in flight finished before the stop, in its first attempt" count_is "id = $job AND status = 'done' AND attempts = 1" 1
check "the binary and the unit gone, the config kept" test ! -e "$R/usr/bin/myjob" -a ! -e "$R/usr/lib/systemd/system/myjob@.service" -a -e "$R/etc/myjob/myjob.toml"
check "nothing left claimed or pending" count_is "status IN ('claimed', 'pending', 'scheduled')" 0
check "dpkg -P myjob" sd dpkg -P myjob
check "the statoverrides gone" test -z "$(sd dpkg-statoverride --list '/etc/myjob*')"
check "the enabled instance's link gone" test -z "$(find "$R/etc/systemd/system" -name 'myjob@*')"
check "the myjob user and the admin's password file kept" sd sh -c 'id myjob >/dev/null && test -e /etc/myjob/db-password'
check "no dpkg state of myjob left" test -z "$(sd dpkg-query -W -f '${db:Status-Status}' myjob 2>/dev/null | grep -v not-installed)"

rm -rf "$R/etc/myjob" "$R/root/myjob.deb" "$R/root/myjob-newer.deb" "$R/root/admin.toml"
mariadb -e "DROP DATABASE $DB; DROP USER 'myjob_pkg'@'127.0.0.1'"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
