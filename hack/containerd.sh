#!/usr/bin/env bash
# A private, throw-away containerd for crisp's end-to-end tests and demo.
#
#   hack/containerd.sh start DIR [--cni] [--owner-pid PID]
#   hack/containerd.sh stop  DIR
#
# start: everything lives under DIR (absolute path recommended, keep it short:
# unix socket paths are limited to 107 bytes):
#   DIR/containerd.sock        CRI + containerd gRPC socket (printed on success)
#   DIR/containerd.sock.ttrpc  ttrpc socket
#   DIR/containerd.log         containerd's log
#   DIR/containerd.pid         containerd's pid
#   DIR/config.toml            generated config (version 2)
#   DIR/root DIR/state DIR/tmp containerd root / state / temp
#   DIR/runc                   runc state root of the shims
#   DIR/cni                    CNI conf dir (empty without --cni)
#   DIR/cni-ipam               host-local IPAM data dir (--cni)
# so several can run side by side and next to a system containerd. The CRI plugin
# uses restrict_oom_score_adj = true (mandatory on these VMs) and
# sandbox_image = crisp.test/pause:latest; the images built by hack/images.sh
# (cache: ${CRISP_IMAGE_CACHE:-/var/tmp/crisp-images}) are imported into
# namespace k8s.io as crisp.test/busybox:latest and crisp.test/pause:latest.
# Calling start on a DIR whose containerd is running just prints the socket; on a
# DIR whose containerd died (or was killed) it starts containerd again with the
# same config, socket and state, so existing shims and containers are re-attached.
#
# --cni writes a bridge + host-local + portmap conflist with a bridge name
# (crisp<N>) and /24 subnet (10.<200+N%50>.<N%250>.0/24) derived from DIR, reserved
# in /run/crisp-cni so concurrent instances never share one.
#
# --owner-pid PID starts a watchdog that runs `stop DIR` once PID has exited
# (used by the Rust harness so a killed test run leaves nothing behind).
#
# stop: SIGKILLs containerd, every container (runc kill + delete -f, which also
# removes their cgroups) and every shim of DIR, removes the shims' sockets in
# /run/containerd/s, unmounts everything under DIR (rootfs overlays, sandbox shm,
# netns bind mounts), removes the CNI bridge, the iptables rules tagged with its
# network name, the libcni result cache entries (/var/lib/cni/results) and the
# subnet reservation, and deletes DIR. The last CNI instance to stop also removes
# portmap's shared CNI-HOSTPORT-* chains (when no mapping is left in them) and
# restores net.ipv4.ip_forward (the bridge plugin turns it on); the last
# containerd on the machine to stop removes the empty /sys/fs/cgroup/*/k8s.io.
# Refuses to touch a DIR without the .crisp-containerd marker. Idempotent.
#
# CRISP_CONTAINERD_BIN=/path/to/containerd runs that containerd instead of the one
# in PATH (e.g. a 1.7.x or 2.x built by hack/containerd-versions.sh); its directory
# goes first in PATH, so a containerd-shim-runc-v2 (and ctr) next to it is used too.
# Unset: the containerd in PATH (Debian's 1.6.20 after hack/setup.sh).
set -euo pipefail

SELF="$(readlink -f "${BASH_SOURCE[0]}")"
HACK="$(dirname "$SELF")"
MARKER=".crisp-containerd"
PAUSE_IMAGE="crisp.test/pause:latest"
BUSYBOX_IMAGE="crisp.test/busybox:latest"
IMAGE_CACHE="${CRISP_IMAGE_CACHE:-/var/tmp/crisp-images}"
CNI_BIN_DIR=/usr/lib/cni
CNI_RESERVE_DIR=/run/crisp-cni
CNI_LOCK=/run/lock/crisp-cni.lock
START_TIMEOUT_S="${CRISP_CONTAINERD_START_TIMEOUT:-20}"
CONTAINERD="containerd"
if [[ -n "${CRISP_CONTAINERD_BIN:-}" ]]; then
  CONTAINERD="$(readlink -f "$CRISP_CONTAINERD_BIN")"
  [[ -x "$CONTAINERD" ]] || {
    echo "hack/containerd.sh: error: CRISP_CONTAINERD_BIN=$CRISP_CONTAINERD_BIN is not an executable" >&2
    exit 1
  }
  PATH="$(dirname "$CONTAINERD"):$PATH"
  export PATH
fi
# The daemon's (and its shims' publish helpers') argv[0] basename, to find them by.
CONTAINERD_NAME="${CONTAINERD##*/}"

log() { echo "hack/containerd.sh: $*" >&2; }
die() {
  echo "hack/containerd.sh: error: $*" >&2
  exit 1
}

usage() {
  die "usage: $0 start DIR [--cni] [--owner-pid PID] | $0 stop DIR"
}

require_root() {
  [[ "$(id -u)" -eq 0 ]] || die "must run as root (containerd, runc, mounts, CNI need it)"
}

# now_ms: monotonic-enough wall clock in milliseconds (bash 5 EPOCHREALTIME).
now_ms() {
  local t="${EPOCHREALTIME/./}"
  echo $((t / 1000))
}

# abs DIR: absolute, symlink-free path of an existing directory.
abs() { (cd "$1" && pwd -P); }

# proc_cmdline PID: the process's argv joined by spaces (empty if gone).
proc_cmdline() {
  local pid="$1"
  local args=()
  [[ -r "/proc/$pid/cmdline" ]] || return 0
  mapfile -d "" args 2>/dev/null <"/proc/$pid/cmdline" || return 0
  echo "${args[*]}"
}

# alive PID: process exists and is not a zombie.
alive() {
  local pid="$1" state
  [[ -n "$pid" && -e "/proc/$pid" ]] || return 1
  state="$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != "Z" && "$state" != "X" ]]
}

# wait_gone TIMEOUT_MS PID...: poll until none of the pids is alive.
wait_gone() {
  local timeout_ms="$1" deadline pid any
  shift
  deadline=$(($(now_ms) + timeout_ms))
  while :; do
    any=0
    for pid in "$@"; do
      if alive "$pid"; then any=1; fi
    done
    [[ $any -eq 0 ]] && return 0
    (($(now_ms) < deadline)) || return 1
    sleep 0.02
  done
}

# dir_pids KIND DIR: pids of DIR's processes of one KIND, found by command line:
#   daemon   containerd --config DIR/config.toml
#   shim     containerd-shim-* ... -address DIR/containerd.sock
#   publish  containerd --address DIR/containerd.sock publish ... (spawned by shims)
dir_pids() {
  local kind="$1" dir="$2" p args cmd
  local sock="$dir/containerd.sock"
  for p in /proc/[0-9]*; do
    args=()
    mapfile -d "" args 2>/dev/null <"$p/cmdline" || continue
    [[ ${#args[@]} -gt 0 ]] || continue
    cmd=" ${args[*]} "
    case "$kind:${args[0]##*/}" in
      "daemon:$CONTAINERD_NAME")
        [[ "$cmd" == *" --config $dir/config.toml "* ]] && echo "${p#/proc/}" ;;
      shim:containerd-shim*)
        [[ "$cmd" == *" -address $sock "* ]] && echo "${p#/proc/}" ;;
      "publish:$CONTAINERD_NAME")
        [[ "$cmd" == *" --address $sock "*" publish "* ]] && echo "${p#/proc/}" ;;
    esac
  done
  return 0
}

# kill_wait WHAT PID...: SIGKILL the pids and wait (max 5 s) until they are gone.
kill_wait() {
  local what="$1"
  shift
  [[ $# -gt 0 ]] || return 0
  kill -KILL "$@" 2>/dev/null || true
  wait_gone 5000 "$@" || log "warning: $what $* still alive 5 s after SIGKILL"
}

# any_containerd_running: true if any containerd daemon (ours or not) is alive.
any_containerd_running() {
  local c comm
  for c in /proc/[0-9]*/comm; do
    comm=""
    read -r comm 2>/dev/null <"$c" || true
    if [[ "$comm" == containerd || "$comm" == "${CONTAINERD_NAME:0:15}" ]] && alive "$(basename "$(dirname "$c")")"; then
      return 0
    fi
  done
  return 1
}

log_tail() {
  local dir="$1"
  if [[ -f "$dir/containerd.log" ]]; then
    echo "---- last 40 lines of $dir/containerd.log ----" >&2
    tail -n 40 "$dir/containerd.log" >&2 || true
    echo "----" >&2
  fi
}

# ---------------------------------------------------------------------------
# config

# pick_snapshotter DIR: overlayfs if an overlay mount works on DIR's filesystem,
# otherwise native.
pick_snapshotter() {
  local dir="$1" t="$1/.overlay-probe" ok=0
  if grep -qw overlay /proc/filesystems 2>/dev/null || modprobe overlay 2>/dev/null; then
    mkdir -p "$t/lower1" "$t/lower2" "$t/upper" "$t/work" "$t/merged"
    if mount -t overlay overlay \
      -o "lowerdir=$t/lower1:$t/lower2,upperdir=$t/upper,workdir=$t/work" "$t/merged" 2>/dev/null; then
      ok=1
      umount "$t/merged" || umount -l "$t/merged" || true
    fi
    rm -rf --one-file-system "$t"
  fi
  if [[ $ok -eq 1 ]]; then echo overlayfs; else echo native; fi
}

write_config() {
  local dir="$1" snapshotter="$2"
  cat >"$dir/config.toml.new" <<EOF
# Generated by hack/containerd.sh for a private, throw-away containerd.
version = 2
root = "$dir/root"
state = "$dir/state"
temp = "$dir/tmp"
oom_score = 0
# Not needed by CRI; disabling them keeps start-up fast and keeps containerd from
# touching paths outside DIR (the opt plugin creates /opt/containerd).
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$dir/containerd.sock"
  uid = 0
  gid = 0

[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
  uid = 0
  gid = 0

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.gc.v1.scheduler"]
    startup_delay = "100ms"

  [plugins."io.containerd.runtime.v1.linux"]
    runtime_root = "$dir/runc-v1"

  [plugins."io.containerd.grpc.v1.cri"]
    # Mandatory here: the VM denies CAP_SYS_RESOURCE, so runc cannot lower
    # oom_score_adj and every RunPodSandbox fails without this.
    restrict_oom_score_adj = true
    sandbox_image = "$PAUSE_IMAGE"
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    disable_apparmor = true
    disable_hugetlb_controller = true
    tolerate_missing_hugetlb_controller = true
    systemd_cgroup = false
    # Keep pod network namespaces under DIR/state instead of /var/run/netns.
    netns_mounts_under_state_dir = true
    max_container_log_line_size = 16384

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "$snapshotter"
      default_runtime_name = "runc"
      disable_snapshot_annotations = true

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "$dir/runc"
          SystemdCgroup = false

      # Pods that ask for the handler "isolated" run in a network namespace of their own
      # behind the one CNI set up, as VM-isolated pods do (hack/isolated-runc says how; e2e
      # probe_isolated.rs). Same runc, same state root.
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.isolated]
        runtime_type = "io.containerd.runc.v2"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.isolated.options]
          BinaryName = "$HACK/isolated-runc"
          Root = "$dir/runc"
          SystemdCgroup = false

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN_DIR"
      conf_dir = "$dir/cni"
      max_conf_num = 1

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = ""
EOF
  mv -f "$dir/config.toml.new" "$dir/config.toml"
}

# ---------------------------------------------------------------------------
# CNI: per-DIR bridge/subnet, reserved in $CNI_RESERVE_DIR/<N> -> DIR

cni_lock() {
  mkdir -p "$(dirname "$CNI_LOCK")"
  exec 8>"$CNI_LOCK"
  flock 8
}
cni_unlock() { exec 8>&-; }

# cni_reserve DIR: prints N, the first free slot starting from hash(DIR).
cni_reserve() {
  local dir="$1" hash n i slot owner subnet
  hash="$(printf '%s' "$dir" | cksum | cut -d' ' -f1)"
  cni_lock
  mkdir -p "$CNI_RESERVE_DIR"
  if [[ ! -e "$CNI_RESERVE_DIR/ip_forward.orig" ]] && ! ls "$CNI_RESERVE_DIR"/[0-9]* >/dev/null 2>&1; then
    # first user: remember ip_forward (the bridge plugin's isGateway turns it on)
    cat /proc/sys/net/ipv4/ip_forward >"$CNI_RESERVE_DIR/ip_forward.orig"
  fi
  for ((i = 0; i < 12500; i++)); do
    n=$(((hash + i) % 12500))
    slot="$CNI_RESERVE_DIR/$n"
    if [[ -L "$slot" ]]; then
      owner="$(readlink "$slot")"
      if [[ "$owner" == "$dir" ]]; then break; fi
      # stale: owner directory gone and its bridge gone
      if [[ ! -d "$owner" ]] && ! ip link show "crisp$n" >/dev/null 2>&1; then
        rm -f "$slot"
      else
        continue
      fi
    fi
    # skip slots whose bridge or subnet is in use by something else
    subnet="$(cni_subnet "$n")"
    if ip link show "crisp$n" >/dev/null 2>&1 || [[ -n "$(ip -4 route show "$subnet" 2>/dev/null)" ]]; then
      continue
    fi
    if ln -s "$dir" "$slot" 2>/dev/null; then break; fi
  done
  cni_unlock
  ((i < 12500)) || die "no free CNI slot in $CNI_RESERVE_DIR"
  echo "$n"
}

cni_subnet() {
  local n="$1"
  echo "10.$((200 + n % 50)).$((n % 250)).0/24"
}

write_cni_conf() {
  local dir="$1" n bridge subnet net
  n="$(cni_reserve "$dir")"
  bridge="crisp$n"
  subnet="$(cni_subnet "$n")"
  net="crisp-net-$n"
  mkdir -p "$dir/cni-ipam"
  cat >"$dir/cni.env" <<EOF
CNI_SLOT=$n
CNI_BRIDGE=$bridge
CNI_SUBNET=$subnet
CNI_NETWORK=$net
EOF
  cat >"$dir/cni/10-crisp.conflist.new" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$net",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni-ipam",
        "ranges": [[{ "subnet": "$subnet" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    {
      "type": "portmap",
      "capabilities": { "portMappings": true }
    }
  ]
}
EOF
  mv -f "$dir/cni/10-crisp.conflist.new" "$dir/cni/10-crisp.conflist"
}

# iptables_cleanup NETWORK: delete every rule tagged with the network's comment
# (bridge ipMasq, portmap) in nat/filter/mangle, then the per-container CNI-*
# chains they jumped to.
iptables_cleanup() {
  local net="$1" table rule chains chain
  command -v iptables >/dev/null 2>&1 || return 0
  for table in nat filter mangle; do
    chains=()
    while IFS= read -r rule; do
      [[ "$rule" == -A\ * ]] || continue
      if [[ "$rule" =~ -j\ (CNI-[A-Za-z0-9-]+) ]]; then
        chain="${BASH_REMATCH[1]}"
        case "$chain" in
          CNI-HOSTPORT-*|CNI-FORWARD|CNI-ADMIN) ;; # shared chains: keep
          *) chains+=("$chain") ;;
        esac
      fi
      # The rule text comes from iptables -S and only holds our network name and
      # hex container ids; eval restores its quoting for -D.
      eval "iptables -w -t $table -D ${rule#-A }" 2>/dev/null || true
    done < <(iptables -w -t "$table" -S 2>/dev/null | grep -F "name: \\\"$net\\\"" || true)
    for chain in "${chains[@]+"${chains[@]}"}"; do
      iptables -w -t "$table" -F "$chain" 2>/dev/null || true
      iptables -w -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

# cni_cache_cleanup DIR: libcni keeps ADD results in /var/lib/cni/results/
# <network>-<sandbox id>-<ifname> (containerd's own "cni-loopback" network too,
# even after a clean StopPodSandbox); drop those of DIR's sandboxes.
# portmap_shared_cleanup: remove the portmap plugin's shared nat chains
# (CNI-HOSTPORT-DNAT/-MASQ/-SETMARK and the jumps to them), which even a clean
# CNI DEL leaves behind, unless some pod still has a port mapping in them.
# portmap re-creates them on its next ADD.
portmap_shared_cleanup() {
  local rule chain
  command -v iptables >/dev/null 2>&1 || return 0
  iptables -w -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1 || return 0
  if iptables -w -t nat -S CNI-HOSTPORT-DNAT 2>/dev/null | grep -q '^-A '; then
    return 0
  fi
  while IFS= read -r rule; do
    eval "iptables -w -t nat -D ${rule#-A }" 2>/dev/null || true
  done < <(iptables -w -t nat -S 2>/dev/null \
    | grep -E '^-A (PREROUTING|OUTPUT|POSTROUTING) .*-j CNI-HOSTPORT-(DNAT|MASQ)$' || true)
  for chain in CNI-HOSTPORT-DNAT CNI-HOSTPORT-MASQ CNI-HOSTPORT-SETMARK; do
    iptables -w -t nat -F "$chain" 2>/dev/null || true
  done
  for chain in CNI-HOSTPORT-DNAT CNI-HOSTPORT-MASQ CNI-HOSTPORT-SETMARK; do
    iptables -w -t nat -X "$chain" 2>/dev/null || true
  done
}

cni_cache_cleanup() {
  local dir="$1" sb id
  [[ -d /var/lib/cni/results ]] || return 0
  for sb in "$dir"/root/io.containerd.grpc.v1.cri/sandboxes/* "$dir"/state/io.containerd.grpc.v1.cri/sandboxes/*; do
    [[ -d "$sb" ]] || continue
    id="${sb##*/}"
    rm -f /var/lib/cni/results/*-"$id"-* 2>/dev/null || true
  done
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
}

cni_cleanup() {
  local dir="$1" CNI_SLOT="" CNI_BRIDGE="" CNI_NETWORK="" CNI_SUBNET="" others
  [[ -f "$dir/cni.env" ]] || return 0
  # shellcheck disable=SC1091
  . "$dir/cni.env"
  : "$CNI_SUBNET"
  iptables_cleanup "$CNI_NETWORK"
  if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    ip link delete "$CNI_BRIDGE" 2>/dev/null || log "warning: could not delete bridge $CNI_BRIDGE"
  fi
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  cni_lock
  if [[ "$(readlink "$CNI_RESERVE_DIR/$CNI_SLOT" 2>/dev/null || true)" == "$dir" ]]; then
    rm -f "$CNI_RESERVE_DIR/$CNI_SLOT"
  fi
  others="$(find "$CNI_RESERVE_DIR" -mindepth 1 -maxdepth 1 -name '[0-9]*' 2>/dev/null | head -n1 || true)"
  if [[ -z "$others" && -d "$CNI_RESERVE_DIR" ]]; then
    # last user gone: drop portmap's shared chains, restore ip_forward as we found it
    portmap_shared_cleanup
    if [[ -f "$CNI_RESERVE_DIR/ip_forward.orig" ]]; then
      cat "$CNI_RESERVE_DIR/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
      rm -f "$CNI_RESERVE_DIR/ip_forward.orig"
    fi
    rmdir "$CNI_RESERVE_DIR" 2>/dev/null || true
  fi
  cni_unlock
}

# ---------------------------------------------------------------------------
# start

images_present() {
  local sock="$1" list
  list="$(ctr --address "$sock" -n k8s.io images ls -q 2>/dev/null)" || return 1
  grep -qxF "$PAUSE_IMAGE" <<<"$list" && grep -qxF "$BUSYBOX_IMAGE" <<<"$list"
}

start_watchdog() {
  local dir="$1" owner="$2" wpid
  if [[ -f "$dir/watchdog.pid" ]] && alive "$(cat "$dir/watchdog.pid")"; then
    return 0
  fi
  alive "$owner" || die "--owner-pid $owner is not running"
  # tail --pid returns once the owner exits; then tear everything down.
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid bash -c 'tail --pid="$1" -f /dev/null >/dev/null 2>&1; exec "$2" stop "$3"' \
    crisp-containerd-watchdog "$owner" "$SELF" "$dir" </dev/null >/dev/null 2>&1 &
  wpid=$!
  echo "$wpid" >"$dir/watchdog.pid"
}

cmd_start() {
  local dir="" cni=0 owner="" arg
  while [[ $# -gt 0 ]]; do
    arg="$1"
    shift
    case "$arg" in
      --cni) cni=1 ;;
      --owner-pid)
        [[ $# -gt 0 ]] || usage
        owner="$1"
        shift
        ;;
      -*) usage ;;
      *)
        [[ -z "$dir" ]] || usage
        dir="$arg"
        ;;
    esac
  done
  [[ -n "$dir" ]] || usage
  require_root
  local bin
  for bin in "$CONTAINERD" ctr runc containerd-shim-runc-v2 umoci; do
    command -v "$bin" >/dev/null 2>&1 || die "'$bin' not found: run hack/setup.sh"
  done
  if [[ $cni -eq 1 ]]; then
    [[ -x "$CNI_BIN_DIR/bridge" && -x "$CNI_BIN_DIR/host-local" && -x "$CNI_BIN_DIR/portmap" ]] \
      || die "CNI plugins missing in $CNI_BIN_DIR: run hack/setup.sh"
  fi

  local t0
  t0="$(now_ms)"
  mkdir -p "$dir"
  dir="$(abs "$dir")"
  [[ "$dir" != "/" ]] || die "refusing to use / as DIR"
  if [[ ! -e "$dir/$MARKER" ]]; then
    if [[ -n "$(ls -A "$dir")" ]]; then
      die "$dir is not empty and not a crisp containerd dir (no $MARKER)"
    fi
    : >"$dir/$MARKER"
  fi
  local sock="$dir/containerd.sock"
  ((${#sock} <= 100)) || die "socket path too long for a unix socket (${#sock} > 100 bytes): $sock"

  # Already running? Just report the socket.
  local pid=""
  if [[ -f "$dir/containerd.pid" ]]; then pid="$(cat "$dir/containerd.pid")"; fi
  if [[ -n "$pid" ]] && alive "$pid" && [[ "$(proc_cmdline "$pid")" == *"--config $dir/config.toml"* ]]; then
    if [[ -n "$owner" ]]; then start_watchdog "$dir" "$owner"; fi
    echo "$sock"
    return 0
  fi

  mkdir -p "$dir/root" "$dir/state" "$dir/tmp" "$dir/runc" "$dir/cni"
  if [[ ! -f "$dir/config.toml" ]]; then
    write_config "$dir" "$(pick_snapshotter "$dir")"
  fi
  if [[ $cni -eq 1 && ! -f "$dir/cni/10-crisp.conflist" ]]; then
    write_cni_conf "$dir"
  fi
  local snapshotter
  snapshotter="$(sed -n 's/^ *snapshotter = "\(.*\)"$/\1/p' "$dir/config.toml" | head -n1)"
  if [[ -n "$owner" ]]; then start_watchdog "$dir" "$owner"; fi

  # Build (or reuse) the images while nothing else is going on.
  "$HACK/images.sh" "$IMAGE_CACHE" >&2 || die "hack/images.sh $IMAGE_CACHE failed"

  local t_images
  t_images="$(now_ms)"

  # Start containerd in its own session, detached from our stdio.
  setsid "$CONTAINERD" --config "$dir/config.toml" </dev/null >>"$dir/containerd.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/containerd.pid"

  local deadline=$(($(now_ms) + START_TIMEOUT_S * 1000))
  until ctr --address "$sock" --timeout 1s version >/dev/null 2>&1; do
    if ! alive "$pid"; then
      log_tail "$dir"
      die "containerd (pid $pid) exited during start-up; config $dir/config.toml"
    fi
    if (($(now_ms) >= deadline)); then
      log_tail "$dir"
      die "containerd (pid $pid) did not answer on $sock within ${START_TIMEOUT_S}s"
    fi
    sleep 0.02
  done
  local t_up
  t_up="$(now_ms)"

  if ! images_present "$sock"; then
    # images.tar holds both images, named via io.containerd.image.name.
    ctr --address "$sock" -n k8s.io images import --snapshotter "$snapshotter" \
      "$IMAGE_CACHE/images.tar" >"$dir/import.log" 2>&1 || {
      cat "$dir/import.log" >&2
      log_tail "$dir"
      die "importing $IMAGE_CACHE/images.tar into $sock (namespace k8s.io) failed"
    }
    images_present "$sock" \
      || die "images $PAUSE_IMAGE / $BUSYBOX_IMAGE missing after importing $IMAGE_CACHE/images.tar: $(cat "$dir/import.log")"
  fi
  local t_end
  t_end="$(now_ms)"
  log "containerd pid $pid ready on $sock (snapshotter $snapshotter;" \
    "images.sh $((t_images - t0)) ms, containerd up $((t_up - t_images)) ms," \
    "import $((t_end - t_up)) ms, total $((t_end - t0)) ms)"
  echo "$sock"
}

# ---------------------------------------------------------------------------
# stop

# mounts_under DIR: mount points below DIR, deepest/latest first.
mounts_under() {
  local dir="$1"
  # field 5 of mountinfo is the mount point, with space/tab/newline/backslash octal-escaped
  awk -v d="$dir/" '{ if (index($5, d) == 1 || $5 == substr(d, 1, length(d) - 1)) print $5 }' /proc/self/mountinfo \
    | while IFS= read -r mp; do printf '%b\n' "$mp"; done \
    | tac
}

unmount_all() {
  local dir="$1" mp round
  for round in 1 2 3 4 5; do
    local any=0
    while IFS= read -r mp; do
      [[ -n "$mp" ]] || continue
      any=1
      umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
    done < <(mounts_under "$dir")
    [[ $any -eq 0 ]] && return 0
    : "$round"
  done
  [[ -z "$(mounts_under "$dir")" ]]
}

kill_containers() {
  local dir="$1" root id
  for root in "$dir"/runc/* "$dir"/runc-v1/*; do
    [[ -d "$root" ]] || continue
    while IFS= read -r id; do
      [[ -n "$id" ]] || continue
      runc --root "$root" kill --all "$id" KILL >/dev/null 2>&1 || true
      runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
    done < <(runc --root "$root" list -q 2>/dev/null || true)
  done
}

cmd_stop() {
  [[ $# -eq 1 ]] || usage
  require_root
  local dir="$1"
  [[ -n "$dir" && "$dir" != "/" ]] || die "refusing to stop DIR '$dir'"
  if [[ ! -d "$dir" ]]; then
    return 0
  fi
  dir="$(abs "$dir")"
  [[ "$dir" != "/" ]] || die "refusing to stop DIR '/'"
  [[ -e "$dir/$MARKER" ]] || die "$dir is not a crisp containerd dir (no $MARKER); not touching it"

  # 1. the watchdog (unless we are it)
  if [[ -f "$dir/watchdog.pid" ]]; then
    local w
    w="$(cat "$dir/watchdog.pid")"
    if [[ -n "$w" && "$w" != "$$" ]] && alive "$w" \
      && [[ "$(proc_cmdline "$w")" == *crisp-containerd-watchdog* ]]; then
      kill -KILL -- "-$w" 2>/dev/null || kill -KILL "$w" 2>/dev/null || true
    fi
  fi

  # 2. containerd (the pid file, and any other daemon on DIR's config)
  local pids=() p
  if [[ -f "$dir/containerd.pid" ]]; then
    p="$(cat "$dir/containerd.pid")"
    if [[ -n "$p" ]] && alive "$p" && [[ "$(proc_cmdline "$p")" == *"--config $dir/config.toml"* ]]; then
      pids+=("$p")
    fi
  fi
  mapfile -t -O "${#pids[@]}" pids < <(dir_pids daemon "$dir")
  kill_wait containerd "${pids[@]+"${pids[@]}"}"

  # 3. containers (while their shims still reap them), then the shims, their
  # event publishers, and the shims' sockets in /run/containerd/s
  kill_containers "$dir"
  local shim_socks=() addr f
  for f in "$dir"/state/io.containerd.runtime.v2.task/*/*/address; do
    [[ -f "$f" ]] || continue
    addr="$(cat "$f")"
    addr="${addr#unix://}"
    [[ "$addr" == /run/containerd/s/* ]] && shim_socks+=("$addr")
  done
  mapfile -t pids < <(dir_pids shim "$dir")
  kill_wait shims "${pids[@]+"${pids[@]}"}"
  mapfile -t pids < <(dir_pids publish "$dir")
  kill_wait "containerd publish" "${pids[@]+"${pids[@]}"}"
  # a second pass catches containers a dying shim had still been creating
  kill_containers "$dir"
  if [[ ${#shim_socks[@]} -gt 0 ]]; then
    rm -f "${shim_socks[@]}"
  fi
  # /run/containerd/s is shared by every instance's shims (containerd 1.6 puts shim sockets
  # there whatever its state dir): it is left in place, even when empty. Removing it here raced
  # another instance's shim between its MkdirAll and its bind ("mkdir /run/containerd/s: no
  # such file or directory" failed a RunPodSandbox in a CI run).

  # 4. mounts (rootfs overlays, sandbox shm, netns bind mounts) under DIR
  unmount_all "$dir" || {
    mounts_under "$dir" >&2
    die "could not unmount everything under $dir; not deleting it"
  }

  # 5. network
  cni_cleanup "$dir"
  cni_cache_cleanup "$dir"

  # 6. the per-namespace parent cgroup runc created (/sys/fs/cgroup/*/k8s.io), only
  # when no containerd at all is left that could be creating containers in it;
  # rmdir fails on a cgroup that still has children, so this never disturbs others.
  if ! any_containerd_running; then
    local cg
    for cg in /sys/fs/cgroup/*/k8s.io /sys/fs/cgroup/k8s.io; do
      if [[ -d "$cg" ]]; then rmdir "$cg" 2>/dev/null || true; fi
    done
  fi

  # 7. the directory
  rm -rf --one-file-system "$dir" || die "could not delete $dir"
}

# ---------------------------------------------------------------------------

[[ $# -ge 1 ]] || usage
cmd="$1"
shift
case "$cmd" in
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  *) usage ;;
esac
