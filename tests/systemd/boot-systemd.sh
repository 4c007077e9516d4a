#!/bin/bash
# boot-systemd.sh — boot a real systemd (PID 1 of its own PID namespace) on a host whose
# PID 1 is not systemd (a container, a CI VM), for the end-to-end tests of myjob@.service.
#
#   boot-systemd.sh [up]    build the rootfs if needed (debootstrap, ~1.5 min once), boot, wait until running
#   boot-systemd.sh down    power the container off and clean up its cgroup
#   boot-systemd.sh status  print state; exit 0 if running
#   boot-systemd.sh rootfs  print the rootfs path (copy binaries / unit files in there from the host)
#   boot-systemd.sh pid     print the host PID of the container's systemd
#
# Needs: root with CAP_SYS_ADMIN, util-linux (unshare, nsenter), a cgroup2 mount (any: pure v2 or the
# 'unified' one of a hybrid layout; one is mounted under $SDH_DIR if none), Debian's `debootstrap`
# (apt-get installed if missing). Nothing outside Debian's archive. The container shares the host's
# network namespace (so units reach e.g. MariaDB on 127.0.0.1:3306) but has its own PID, mount, UTS,
# IPC and cgroup namespaces and its own /dev, /run, /tmp.
#
# Env: SDH_DIR (state dir, default /var/tmp/myjob-systemd; keep it OUT of git work trees: ~280 MB),
#      SDH_SUITE (default: host's VERSION_CODENAME, so glibc matches host-built binaries),
#      SDH_MIRROR (default: first Debian URI in the host's apt sources), SDH_INCLUDE (extra packages, comma list).
set -euo pipefail

SDH_DIR=${SDH_DIR:-/var/tmp/myjob-systemd}
ROOTFS=$SDH_DIR/rootfs
PIDFILE=$SDH_DIR/systemd.pid
LOG=$SDH_DIR/boot.log
CG_NAME=sdharness-$(echo -n "$SDH_DIR" | md5sum | cut -c1-8)

die() { echo "boot-systemd: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

running_pid() {
  local p
  p=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$p" ] && [ -e "/proc/$p" ] || return 1
  # must be a systemd whose root is our rootfs
  [ "$(stat -L -c %i "/proc/$p/root/.sdh-rootfs" 2>/dev/null)" = "$(stat -c %i "$ROOTFS/.sdh-rootfs" 2>/dev/null)" ] || return 1
  echo "$p"
}

cg2_root() {
  local m
  m=$(findmnt -rn -t cgroup2 -o TARGET | head -n1 || true)
  if [ -z "$m" ]; then
    m=$SDH_DIR/cgroup2; mkdir -p "$m"; mount -t cgroup2 none "$m"
  fi
  echo "$m"
}

cleanup_cgroup() {
  local cg; cg="$(cg2_root)/$CG_NAME"
  [ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
}

build_rootfs() {
  [ -f "$ROOTFS/.sdh-rootfs" ] && return 0
  local t0=$SECONDS suite mirror
  suite=${SDH_SUITE:-$(. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}")}
  mirror=${SDH_MIRROR:-$(grep -rhoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | grep -v security | head -n1 | tr -d ' ' || true)}
  [ -n "$mirror" ] || die "no Debian mirror found in the apt sources; set SDH_MIRROR"
  if ! command -v debootstrap >/dev/null; then
    echo "boot-systemd: installing debootstrap" >&2
    nice -n 19 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive nice -n 19 apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  rm -rf "$ROOTFS"; mkdir -p "$SDH_DIR/debcache"
  echo "boot-systemd: debootstrap $suite from $mirror into $ROOTFS (log: $SDH_DIR/debootstrap.log)" >&2
  nice -n 19 debootstrap --variant=minbase --cache-dir="$SDH_DIR/debcache" \
    --include=systemd,systemd-sysv,dbus,procps,passwd${SDH_INCLUDE:+,$SDH_INCLUDE} \
    "$suite" "$ROOTFS" "$mirror" >"$SDH_DIR/debootstrap.log" 2>&1 || { tail -20 "$SDH_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
  # quiet, deterministic boot: no gettys, no apt/fstrim/e2scrub timers, no pstore
  chroot "$ROOTFS" systemctl mask -q getty@tty1.service console-getty.service systemd-firstboot.service \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer \
    e2scrub_reap.service systemd-pstore.service
  echo sdharness > "$ROOTFS/etc/hostname"
  mkdir -p "$ROOTFS/var/log/journal"      # persistent journal: readable from the host after shutdown
  touch "$ROOTFS/.sdh-rootfs"
  echo "boot-systemd: rootfs built in $((SECONDS - t0))s" >&2
}

# stage 2: runs as PID 1 of the new PID namespace, inside new mount/uts/ipc/cgroup namespaces
STAGE2='
set -eu
R=$1 LOG=$2
mount --make-rprivate /
mount --bind "$R" "$R"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t cgroup2 -o nsdelegate cgroup2 "$R/sys/fs/cgroup" 2>/dev/null || mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid,size=4m tmpfs "$R/dev"
mknod -m 666 "$R/dev/null" c 1 3; mknod -m 666 "$R/dev/zero" c 1 5; mknod -m 666 "$R/dev/full" c 1 7
mknod -m 666 "$R/dev/random" c 1 8; mknod -m 666 "$R/dev/urandom" c 1 9; mknod -m 666 "$R/dev/tty" c 5 0
mkdir -p "$R/dev/pts" "$R/dev/shm" "$R/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
touch "$R/dev/console"; mount --bind "$LOG" "$R/dev/console"   # console = a plain file on the host
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
mkdir -p "$R/run/systemd"; echo -n sdharness > "$R/run/systemd/container"
cd "$R"; mkdir -p .oldroot; pivot_root . .oldroot; umount -l /.oldroot; rmdir /.oldroot
exec env -i container=sdharness TERM=dumb /lib/systemd/systemd --show-status=yes
'

up() {
  local p
  if p=$(running_pid); then echo "boot-systemd: already running (pid $p)" >&2; return 0; fi
  mkdir -p "$SDH_DIR"
  build_rootfs
  cleanup_cgroup
  local cg; cg="$(cg2_root)/$CG_NAME"; mkdir -p "$cg"
  : > "$LOG"
  local t0; t0=$(date +%s%N)
  # move this launcher into its own cgroup2 subtree, then unshare: that subtree becomes the container's cgroup root
  ( echo "$BASHPID" > "$cg/cgroup.procs"
    # close inherited fds > 2: the long-lived unshare process must not hold e.g. a CI runner's pipes open
    for fd in $(ls /proc/$BASHPID/fd); do if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi; done
    exec setsid unshare --pid --fork --mount --uts --ipc --cgroup --kill-child=SIGKILL -- bash -c "$STAGE2" stage2 "$ROOTFS" "$LOG"
  ) >>"$LOG" 2>&1 </dev/null &
  local upid=$! child="" i myns q x
  myns=$(readlink /proc/self/ns/pid)
  for i in $(seq 1 200); do        # the container's PID 1 = first descendant of the launcher in another PID namespace
    q=$upid
    while [ -n "$q" ] && [ -z "$child" ]; do
      set -- $q; q=""
      for x in "$@"; do
        if [ "$(readlink /proc/$x/ns/pid 2>/dev/null)" != "$myns" ] && [ -e /proc/$x ]; then child=$x; break; fi
        q="$q $(cat /proc/$x/task/*/children 2>/dev/null || true)"
      done
      q=$(echo $q)
    done
    [ -n "$child" ] && break; sleep 0.05
  done
  [ -n "$child" ] || { cat "$LOG" >&2; die "container did not start"; }
  echo "$child" > "$PIDFILE"
  # wait for systemd (the exec in stage 2) to come up and finish booting
  for i in $(seq 1 600); do
    [ -e /proc/$child ] || { cat "$LOG" >&2; die "container init died"; }
    if [ "$(cat /proc/$child/comm 2>/dev/null)" = systemd ] && [ -S "/proc/$child/root/run/systemd/private" ]; then break; fi
    sleep 0.1
  done
  local st
  st=$(timeout 120 nsenter -t "$child" -m -u -i -p -C -r -w -- systemctl is-system-running --wait 2>&1 || true)
  echo "boot-systemd: systemd pid $child, state '$st', booted in $(( ($(date +%s%N) - t0) / 1000000 )) ms; rootfs $ROOTFS" >&2
  case $st in running|degraded) ;; *) die "boot did not finish (state '$st'); see $LOG and: $(dirname "$0")/run-in-systemd.sh journalctl -b";; esac
}

down() {
  local p i
  if p=$(running_pid); then
    nsenter -t "$p" -m -u -i -p -C -r -w -- systemctl poweroff --no-block >/dev/null 2>&1 || kill -s SIGRTMIN+4 "$p" || true
    for i in $(seq 1 150); do [ -e /proc/$p ] || break; sleep 0.1; done
    [ -e /proc/$p ] && kill -9 "$p"        # killing a PID-namespace init kills the whole namespace
    for i in $(seq 1 50); do [ -e /proc/$p ] || break; sleep 0.1; done
  fi
  rm -f "$PIDFILE"; cleanup_cgroup
  echo "boot-systemd: down" >&2
}

case ${1:-up} in
  up) up ;;
  down|stop) down ;;
  status) if p=$(running_pid); then echo "running pid=$p rootfs=$ROOTFS"; else echo "not running"; exit 3; fi ;;
  rootfs) echo "$ROOTFS" ;;
  pid) running_pid ;;
  *) die "usage: $0 [up|down|status|rootfs|pid]" ;;
esac
