#!/usr/bin/env bash
# Install the host packages crisp's build, end-to-end tests and demo need.
#
# Idempotent: when every package is already installed this is a fast no-op
# (no apt-get update, no network). Must run as root (CI and dev machines are).
#
#   hack/setup.sh
#
# Packages:
#   containerd runc containernetworking-plugins   the real runtime under test
#   jq                                            hack/isolated-runc (the e2e "isolated" handler)
#   busybox-static umoci                          hermetic images (hack/images.sh)
#   socat iproute2 iptables                       demo / CNI bridge cleanup
#   protobuf-compiler                             protoc for tonic/prost build scripts
#   strace                                        socket-mode syscall order (tests/it/reliability_sockets.rs)
#   curl shellcheck                               crisp's metrics on its admin socket in the pleg lane
#                                                 (tests/it/cluster_pleg.rs); lint of the hack/ scripts
#                                                 (tests/it/systemd_units.rs)
#   golang-go golang-google-grpc-dev              real grpc-go peers for the e2e tests (hack/build-grpcgo.sh)
#   debootstrap systemd-container                 the systemd test node (hack/node-rootfs.sh, tests/it/node_*.rs)
#   python3-kubernetes                            offline manifest validation (hack/check-manifests.py)
#   etcd-server docker-registry skopeo            the cluster lane (hack/cluster.sh, tests/it/cluster_rollout.rs)
#   conmon                                        CRI-O's container monitor, copied into the kubelet-1.34-crio
#                                                 lane's node with glib (its dependency) and SQLite (skopeo's)
#   prometheus librsvg2-bin                       a real Prometheus and promtool (e2e/tests/it/prometheus.rs,
#                                                 hack/lint.sh); rsvg-convert (tests/it/timeline.rs)
#   tshark                                        Wireshark's dissectors read `crisp pcap` captures
#                                                 (tests/it/pcap.rs)
#
# Optional, not installed here: a local-only script that needs one installs it on first use.
#   bpftrace                                      hack/observers.sh: uprobes on kubelet's grpc-go client
#                                                 (the mechanism of eBPF gRPC tracers), and the proof that
#                                                 sockdump's kprobes cannot attach on a kernel without them
set -euo pipefail

PACKAGES=(
  containerd
  runc
  jq
  containernetworking-plugins
  busybox-static
  umoci
  socat
  protobuf-compiler
  iproute2
  iptables
  strace
  shellcheck
  curl  # crisp's /metrics over its admin socket in the pleg lane (tests/it/cluster_pleg.rs)
  systemd  # systemd-analyze verify, systemd-socket-activate (tests/it/systemd_*.rs)
  golang-go               # builds crisp-grpcgo offline (GOPATH mode, no module proxy)
  golang-google-grpc-dev  # grpc-go 1.33 sources for it (kubelet's and containerd's gRPC stack)
  debootstrap             # the Debian 12 root of the systemd test node (hack/node-rootfs.sh)
  systemd-container       # systemd-nspawn boots it with systemd as PID 1 (tests/it/node_systemd.rs)
  python3-kubernetes      # the API models deploy/ is validated against (hack/check-manifests.py)
  prometheus              # a real Prometheus scraping crisp (e2e/tests/it/prometheus.rs); promtool checks and
                          # unit-tests deploy/monitoring's alert rules (hack/lint.sh)
  librsvg2-bin            # rsvg-convert renders `crisp timeline --svg` in tests/it/timeline.rs
  tshark                  # Wireshark's HTTP/2, gRPC and protobuf dissectors read `crisp pcap`'s captures
                          # (tests/it/pcap.rs)
  etcd-server             # etcd 3.4 under the cluster lane's kube-apiserver (hack/cluster.sh)
  docker-registry         # a local registry that serves the installer image to the lane's node
  skopeo                  # pushes dist/crisp-installer-*.oci.tar into that registry
  conmon                  # CRI-O's monitor for the kubelet-1.34-crio lane (tests/it/cluster_runtimes.rs) and
                          # hack/crio-smoke.sh; Debian's 2.1.6, which CRI-O 1.34 accepts
)

die() {
  echo "hack/setup.sh: error: $*" >&2
  exit 1
}

if [[ "$(id -u)" -ne 0 ]]; then
  die "must run as root (apt-get install is needed); try: sudo $0"
fi

# Cargo tools the lint step needs, from crates.io, pinned so that CI and developers agree.
CARGO_MACHETE_VERSION=0.9.2
if [[ "$(cargo-machete --version 2>/dev/null || true)" != *"$CARGO_MACHETE_VERSION"* ]]; then
  echo "hack/setup.sh: installing cargo-machete $CARGO_MACHETE_VERSION (crates.io)"
  cargo install --locked --quiet cargo-machete --version "$CARGO_MACHETE_VERSION" \
    || die "cargo install cargo-machete failed"
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  if [[ "$status" != "installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "hack/setup.sh: all packages present"
  exit 0
fi

echo "hack/setup.sh: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Debian's containerd package ships a service; on a machine with a running init
# system it would be started by the postinst. Our tests never use it (each run
# starts a private containerd, see hack/containerd.sh), so keep it from starting.
policy_rc=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "$policy_rc" ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy_rc"
  chmod 0755 "$policy_rc"
  created_policy=1
fi
cleanup() {
  if [[ "$created_policy" -eq 1 ]]; then
    rm -f "$policy_rc"
  fi
}
trap cleanup EXIT

apt-get update -qq || die "apt-get update failed"
apt-get install -y -qq --no-install-recommends "${missing[@]}" \
  || die "apt-get install ${missing[*]} failed"

# Check the binaries the harness relies on really are there now.
for bin in containerd ctr runc jq umoci busybox socat protoc ip iptables go debootstrap systemd-nspawn; do
  command -v "$bin" >/dev/null 2>&1 || die "'$bin' still not on PATH after install"
done
[[ -x /usr/lib/cni/bridge ]] || die "/usr/lib/cni/bridge missing after installing containernetworking-plugins"
[[ -x /bin/busybox ]] || die "/bin/busybox missing after installing busybox-static"
echo "hack/setup.sh: done"
