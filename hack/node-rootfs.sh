#!/usr/bin/env bash
# Builds (once) the root filesystem of the test node that tests/it/node_*.rs boot with
# systemd-nspawn: Debian 12 with systemd as PID 1, containerd and runc as real systemd services.
# Prints its path.
#
#   hack/node-rootfs.sh           # /var/cache/crisp/node-bookworm-<key>, built if missing
#   hack/node-rootfs.sh --force   # rebuild
#
# debootstrap takes about 35 s plus the downloads; the result is cached under /var/cache/crisp
# (outside target/, so `cargo clean` keeps it) and keyed by the package list and this script,
# so a change to either builds a new one. The cached tree is never booted itself: each test
# boots its own overlay of it. Needs root, debootstrap and Debian's package mirror (what apt
# uses); hack/setup.sh installs debootstrap.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

SUITE=bookworm
MIRROR="${CRISP_NODE_MIRROR:-http://deb.debian.org/debian}"
# systemd as PID 1 (systemd-sysv), D-Bus for systemctl, the runtime crisp sits in front of,
# and what hack/install.sh runs with (bash, awk, coreutils, diffutils are in minbase).
INCLUDE=systemd,systemd-sysv,dbus,containerd,runc,ca-certificates
CACHE="${CRISP_NODE_CACHE:-/var/cache/crisp}"

die() {
  echo "hack/node-rootfs.sh: error: $*" >&2
  exit 1
}

key="$(printf '%s\n%s\n%s\n' "$SUITE" "$INCLUDE" "$(sha256sum <"$SELF")" | sha256sum | cut -c1-12)"
OUT="$CACHE/node-$SUITE-$key"

if [[ "${1:-}" != "--force" && -f "$OUT/.crisp-node-ready" ]]; then
  echo "$OUT"
  exit 0
fi
[[ "$(id -u)" -eq 0 ]] || die "must run as root (debootstrap)"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found: run hack/setup.sh"

mkdir -p "$CACHE"
# One builder at a time (tests run in parallel; CI and a developer may share the machine).
exec 9>"$CACHE/.node-rootfs.lock"
flock 9
if [[ "${1:-}" != "--force" && -f "$OUT/.crisp-node-ready" ]]; then
  echo "$OUT"
  exit 0
fi

tmp="$CACHE/.build-$key.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$tmp" "$MIRROR" >"$CACHE/.debootstrap-$key.log" 2>&1 \
  || die "debootstrap failed: see $CACHE/.debootstrap-$key.log"

# The node's identity and its first boot: no machine-id prompt, no getty on the console (the
# tty1 getty skips itself in a container).
echo crisp-node >"$tmp/etc/hostname"
# What a node has and host-network containers (ctr run --net-host, hostNetwork pods) bind-mount.
printf '127.0.0.1\tlocalhost\n127.0.1.1\tcrisp-node\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$tmp/etc/hosts"
[[ -e "$tmp/etc/resolv.conf" ]] || printf 'nameserver 127.0.0.1\n' >"$tmp/etc/resolv.conf"
: >"$tmp/etc/machine-id"
ln -sf /dev/null "$tmp/etc/systemd/system/console-getty.service"
# apt caches are not needed inside the node.
rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*

# The host mounts cgroup v1 controllers read-only into the container; containerd (and runc
# under it) need them writable. A oneshot before containerd remounts each one read-write.
cat >"$tmp/etc/systemd/system/cgroup-rw.service" <<'EOF'
[Unit]
Description=make the cgroup v1 controllers writable (systemd-nspawn mounts them read-only)
DefaultDependencies=no
Before=containerd.service
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for d in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$d" 2>/dev/null || true; done; mount -o remount,rw /sys/fs/cgroup 2>/dev/null || true'

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/cgroup-rw.service "$tmp/etc/systemd/system/multi-user.target.wants/cgroup-rw.service"
mkdir -p "$tmp/etc/systemd/system/containerd.service.d"
printf '[Unit]\nWants=cgroup-rw.service\nAfter=cgroup-rw.service\n' >"$tmp/etc/systemd/system/containerd.service.d/10-cgroup-rw.conf"

touch "$tmp/.crisp-node-ready"
rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
# Older builds of this script are dead weight.
for old in "$CACHE"/node-"$SUITE"-*; do
  [[ "$old" == "$OUT" ]] || rm -rf "$old"
done
echo "$OUT"
