#!/bin/sh
# Entrypoint of the crisp-installer image (hack/release.sh builds it; deploy/ runs it as a
# DaemonSet). Installs crisp onto the node it runs on, or uninstalls it, with the node's own
# hack/install.sh run: the same code, the same checks, the same backups and manifest.
#
#   entrypoint.sh            CRISP_MODE=install (default) or uninstall, then stay running
#   entrypoint.sh ready      readiness probe: exit 0 once the node is in the state asked for
#   entrypoint.sh once       the DaemonSet's init container: install or uninstall, record the
#                            result (done | failed) in $CRISP_STATUS_DIR and exit 0, so that the
#                            pod goes on to its reporter whatever the result (a failed install
#                            is rolled back, not retried: the pod stays un-Ready)
#   entrypoint.sh report     the DaemonSet's unprivileged container: say what was recorded, then
#                            idle until SIGTERM
#   entrypoint.sh reported   its readiness probe: exit 0 when the recorded result is done
#
# The install needs what the DaemonSet gives its init container: privileged and the node's /
# mounted at $CRISP_HOST_ROOT (/host) with its submounts (/run, /proc): the node's PID 1 (its
# systemd) is reached through the node's own procfs there, $HOST/proc/1, and the node's systemd
# through its D-Bus system bus, $HOST/run/dbus/system_bus_socket — so the pod needs no hostPID.
# systemctl's own route, systemd's private socket, refuses a client outside systemd's PID
# namespace (sd-bus cannot see its peer's pid: "Failed to connect to bus: No data available";
# issue #44, tried on a real node), and a container cannot enter the node's PID namespace (an
# ancestor of its own); the bus broker (dbus-daemon, dbus-broker) forwards the same calls from
# any PID namespace, so outside the node's, systemctl runs with SYSTEMCTL_FORCE_BUS=1. A node
# with no system bus needs the pod in its PID namespace (docs/DEPLOY.md, "hostPID"); the
# installer says so and changes nothing. `report` and `reported` need nothing but
# $CRISP_STATUS_DIR (they run as their own uid, no capabilities, read-only root). The image
# holds busybox and /opt/crisp: the static crisp binary, hack/install.sh, hack/uninstall.sh,
# systemd/.
#
# How: the bundle is copied to the node's /run/crisp-installer (tmpfs: gone at reboot, and
# removed again below) and hack/install.sh runs there *in the node's namespaces* (nsenter into
# $HOST/proc/1/ns/{mnt,uts,ipc,net}; not its PID namespace, which a container's process may not
# enter: an ancestor of its own),
# so it uses the node's systemctl and restarts kubelet through the node's systemd, exactly as an
# operator's `sudo hack/install.sh` would. The node needs bash, awk, coreutils and diffutils (any
# systemd distribution has them).
#
# Restarting kubelet does not stop this container: containerd owns it, and through crisp kubelet
# finds the same sandbox and container ids, so it adopts this pod as it was (crisp never
# rewrites ids; a proxy that did would make kubelet kill and recreate every pod, this one too,
# over and over). This process is what is left to repair a node whose kubelet does not come back:
# when the install fails after kubelet was touched, it runs uninstall (kubelet back on the
# runtime), logs why, and stays running without becoming Ready, which stops the DaemonSet's
# rollout (maxUnavailable: 1) at this node. A SIGTERM that arrives while an install runs waits
# for it to finish (the pod's terminationGracePeriodSeconds covers that), so a rollout never cuts
# one in half; afterwards SIGTERM ends the pod at once.
#
# Environment:
#   CRISP_MODE              install | uninstall
#   CRISP_INSTALL_ARGS      extra hack/install.sh arguments (--kubelet-version 1.28, --config F)
#   CRISP_UNINSTALL_ARGS    extra hack/uninstall.sh arguments (--force)
#   CRISP_HOST_ROOT         where the node's / is mounted (/host)
#   CRISP_ONESHOT=1         exit after the install/uninstall instead of staying (tests, Jobs)
#   CRISP_STATUS_DIR        where the result is recorded (/tmp; the DaemonSet: its emptyDir)
set -eu

MODE="${CRISP_MODE:-install}"
HOST="${CRISP_HOST_ROOT:-/host}"
BUNDLE=/opt/crisp
NODE_STAGE=/run/crisp-installer
MANIFEST=/var/lib/crisp/install/manifest
STATUS="${CRISP_STATUS_DIR:-/tmp}/crisp-installer.status"

log() {
  echo "crisp-installer: $*"
}

# A command in the node's namespaces (mount, uts, ipc, net): the node's files and systemd, found
# through the node's procfs under the host mount. The PID namespace stays the pod's: systemctl
# reaches systemd over the system bus there (systemd_route, below).
on_node() {
  nsenter --mount="$HOST/proc/1/ns/mnt" --uts="$HOST/proc/1/ns/uts" \
    --ipc="$HOST/proc/1/ns/ipc" --net="$HOST/proc/1/ns/net" -- "$@"
}

# How systemctl reaches the node's systemd from here: "private" (its own socket) when this pod is
# in the node's PID namespace (hostPID), "bus" (the D-Bus system bus, SYSTEMCTL_FORCE_BUS=1)
# when it is not and the node runs a bus broker, "none" otherwise.
systemd_route() {
  if [ "$(readlink /proc/self/ns/pid)" = "$(readlink "$HOST/proc/1/ns/pid")" ]; then
    echo private
  elif [ -S "$HOST/run/dbus/system_bus_socket" ]; then
    echo bus
  else
    echo none
  fi
}
case "$(systemd_route)" in
  bus) export SYSTEMCTL_FORCE_BUS=1 ;;
  *) ;;
esac

ready() {
  [ "$(cat "$STATUS" 2>/dev/null)" = "done" ] || return 1
  case "$MODE" in
    install) on_node /usr/local/bin/crisp doctor >/dev/null ;;
    uninstall) [ ! -e "$HOST$MANIFEST" ] && on_node systemctl is-active --quiet kubelet.service ;;
  esac
}

stay() {
  trap 'exit 0' TERM INT
  while :; do
    sleep 3600 &
    wait $! || true
  done
}

ONCE=0
case "${1:-}" in
  ready)
    ready
    exit $?
    ;;
  reported)
    [ "$(cat "$STATUS" 2>/dev/null)" = "done" ]
    exit $?
    ;;
  report)
    log "$MODE: $(cat "$STATUS" 2>/dev/null || echo 'nothing recorded') (the installer's log: kubectl -n crisp-system logs $(hostname) -c installer)"
    stay
    ;;
  once) ONCE=1 ;;
  "") ;;
  *)
    log "error: unknown argument '$1' (ready, once, report, reported, or none)"
    exit 2
    ;;
esac

case "$MODE" in
  install | uninstall) ;;
  *)
    log "error: CRISP_MODE must be install or uninstall, not '$MODE'"
    exit 2
    ;;
esac
echo running >"$STATUS"

# Refuse to run anywhere but on a node's systemd: $HOST/proc must be the node's procfs (the
# host mount with its submounts), whose PID 1 is in another mount namespace than this one.
if [ ! -e "$HOST/proc/1/ns/mnt" ] ||
  [ "$(readlink "$HOST/proc/1/ns/mnt")" = "$(readlink /proc/self/ns/mnt)" ]; then
  log "error: $HOST/proc is not the node's procfs: mount the node's / at $HOST with its submounts (hostPath /, mountPropagation: HostToContainer)"
  exit 2
fi
if [ "$(cat "$HOST/proc/1/comm" 2>/dev/null)" != systemd ]; then
  log "error: the node's PID 1 is '$(cat "$HOST/proc/1/comm" 2>/dev/null)', not systemd: crisp's installer needs a systemd node"
  exit 2
fi
[ -d "$HOST/run/systemd/system" ] || {
  log "error: $HOST/run/systemd/system missing: mount the node's / at $HOST with its submounts (hostPath /, mountPropagation: HostToContainer)"
  exit 2
}
if [ "$(systemd_route)" = none ]; then
  log "error: no way to the node's systemd: this pod is not in the node's PID namespace and the node has no D-Bus system bus ($HOST/run/dbus/system_bus_socket); systemd's own socket refuses a client outside its PID namespace. Install dbus on the node, or give the pod hostPID (docs/DEPLOY.md, \"hostPID\"). Nothing was changed."
  exit 2
fi

stage_bundle() {
  rm -rf "$HOST$NODE_STAGE"
  mkdir -p "$HOST$NODE_STAGE"
  chmod 0700 "$HOST$NODE_STAGE"
  cp -a "$BUNDLE/." "$HOST$NODE_STAGE/"
}
unstage_bundle() {
  rm -rf "$HOST$NODE_STAGE"
}

# From here until the install or uninstall is over, a SIGTERM is only noted. (Run by hand or in
# a pod sharing a PID namespace this process is not PID 1, so without a handler SIGTERM would
# kill it mid-way.)
term=0
trap 'term=1; log "SIGTERM: finishing the $MODE first"' TERM INT
start="$(date +%s)"
stage_bundle
rc=0
if [ "$MODE" = install ]; then
  log "installing crisp $("$BUNDLE/crisp" --version 2>/dev/null || true) on $(cat "$HOST/etc/hostname" 2>/dev/null || hostname)"
  # shellcheck disable=SC2086 # word splitting of the extra arguments is intended
  on_node "$NODE_STAGE/hack/install.sh" --binary "$NODE_STAGE/crisp" ${CRISP_INSTALL_ARGS:-} || rc=$?
  if [ "$rc" -eq 0 ]; then
    on_node /usr/local/bin/crisp doctor || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    log "error: install failed (exit $rc)"
    if [ -e "$HOST$MANIFEST" ]; then
      log "rolling back: hack/uninstall.sh --force (kubelet back on the runtime)"
      on_node "$NODE_STAGE/hack/uninstall.sh" --force || log "error: the rollback failed too: fix the node by hand (journalctl -u kubelet -u crisp)"
    fi
  fi
else
  log "uninstalling crisp from $(cat "$HOST/etc/hostname" 2>/dev/null || hostname)"
  # shellcheck disable=SC2086
  on_node "$NODE_STAGE/hack/uninstall.sh" ${CRISP_UNINSTALL_ARGS:-} || rc=$?
fi
unstage_bundle
log "$MODE: exit $rc after $(($(date +%s) - start)) s"

if [ "$rc" -eq 0 ]; then
  echo "done" >"$STATUS"
else
  echo failed >"$STATUS"
fi
if [ "$ONCE" = 1 ]; then
  # The result is recorded; the reporter says it and is Ready only if it is done.
  exit 0
fi
if [ "${CRISP_ONESHOT:-0}" = 1 ] || [ "$term" -eq 1 ]; then
  exit "$rc"
fi
# Not Ready after a failure: the rollout stops here. Deleting the pod retries.
stay
