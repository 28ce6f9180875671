#!/usr/bin/env bash
# CRI-O beside crisp on this host, without kubelet (issue #34; RELIABILITY.md, "containerd 2.x and
# CRI-O beside kubelet 1.34"): starts the CRI-O that hack/crio-binaries.sh built, crisp in front
# of it with `crisp tap --json --full --all` attached, and runs one legacy-sidecar pod (the
# `crisp.dev/sidecars` annotation, an exec readiness check that turns true 3 s after the proxy
# starts) with crictl the way kubelet orders it (proxy created and started, then the app; both
# stopped at once), first on CRI-O's socket (direct), then on crisp's, RUNS times each. Prints, from
# CRI-O's own timestamps (crictl inspect on CRI-O's socket): proxy started → app created and app
# finished → proxy finished, per run.
#
#   sudo hack/crio-smoke.sh [--help]
#
# Environment: CRIO_BIN (default $CRISP_KUBE_CACHE_ROOT/crio-v1.34.11/bin/crio, pinns beside it),
# CRICTL (default crictl on PATH), CRISP (default target/debug/crisp), OUT (default
# target/crio-smoke: config, logs, tap.jsonl; CRI-O's storage under /var/tmp), RUNS (default 2).
# Needs root, Debian's conmon and runc, skopeo, jq and target/cluster-images (hack/images.sh).
# CRI-O runs runc through hack/crio-runc (these VMs lack CAP_SYS_RESOURCE), with vfs storage,
# cgroupfs, host-network pods, NRI on (its socket in OUT). Exit 1 if a run through crisp is not
# ordered (app created ≥ 2,900 ms after the proxy started, proxy finished after the app).
set -euo pipefail
cd "$(dirname "$0")/.."

case ${1:-} in
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
esac
die() {
  echo "hack/crio-smoke.sh: $*" >&2
  exit 1
}
root=${CRISP_KUBE_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/crisp}
crio=${CRIO_BIN:-$root/crio-v1.34.11/bin/crio}
crictl=${CRICTL:-$(command -v crictl || true)}
crisp=${CRISP:-target/debug/crisp}
out=$(mkdir -p "${OUT:-target/crio-smoke}" && cd "${OUT:-target/crio-smoke}" && pwd)
runs=${RUNS:-2}
[[ $EUID -eq 0 ]] || die "needs root"
[[ -x $crio && -x $(dirname "$crio")/pinns ]] || die "no CRI-O at $crio: hack/crio-binaries.sh SRC v1.34.11 $(dirname "$(dirname "$crio")")"
for t in conmon runc skopeo jq; do command -v "$t" >/dev/null || die "no $t (apt-get install $t)"; done
[[ -x $crictl ]] || die "no crictl (CRICTL=PATH)"
[[ -x $crisp ]] || die "no crisp at $crisp (cargo build)"
[[ -f target/cluster-images/busybox.tar ]] || die "no target/cluster-images (hack/images.sh target/cluster-images)"

state=$(mktemp -d /var/tmp/crisp-crio-smoke.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # containers CRI-O left (conmon, the pods' processes) are stopped by their runc state
  for c in "$state"/runc/*/; do
    if [[ -d $c ]]; then runc --root "$state/runc" kill -a "$(basename "$c")" KILL 2>/dev/null || true; fi
  done
  sleep 1
  rm -rf "$state"
}
trap cleanup EXIT

cat >"$out/crio.conf" <<EOF
[crio]
root = "$state/root"
runroot = "$state/run"
storage_driver = "vfs"
log_dir = "$state/log"
version_file = "$state/run/version"
version_file_persist = "$state/version"
clean_shutdown_file = "$state/clean.shutdown"
[crio.api]
listen = "$state/crio.sock"
[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
pinns_path = "$(dirname "$crio")/pinns"
namespaces_dir = "$state/ns"
container_exits_dir = "$state/exits"
container_attach_socket_dir = "$state/attach"
[crio.runtime.runtimes.runc]
runtime_path = "$PWD/hack/crio-runc"
runtime_root = "$state/runc"
monitor_path = "$(command -v conmon)"
[crio.image]
pause_image = "crisp.test/pause:latest"
pause_command = ""
[crio.network]
network_dir = "$state/cni"
plugin_dirs = ["/usr/lib/cni"]
[crio.nri]
enable_nri = true
nri_listen = "$state/nri.sock"
EOF
mkdir -p "$state/cni" "$state/conf.d" "$state/podlogs"
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$state/policy.json"
for i in pause busybox; do
  skopeo --policy "$state/policy.json" copy -q "oci-archive:target/cluster-images/$i.tar" \
    "containers-storage:[vfs@$state/root+$state/run]crisp.test/$i:latest"
done
"$crio" --config "$out/crio.conf" --config-dir "$state/conf.d" --log-level info >"$out/crio.log" 2>&1 &
pids+=($!)
"$crisp" --listen "$state/crisp.sock" --upstream "$state/crio.sock" --log-level info >"$out/crisp.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S $state/crio.sock && -S $state/admin.sock ]] && break; sleep 0.1; done
"$crisp" tap --json --full --all --admin-socket "$state/admin.sock" >"$out/tap.jsonl" 2>/dev/null &
pids+=($!)
c() { "$crictl" --timeout 60s -r "unix://$state/$1" -i "unix://$state/$1" "${@:2}"; }
echo "crio| $(c crio.sock version | tr '\n' ' ')"
echo "crio| through crisp: $(c crisp.sock version | grep RuntimeVersion) NRI socket: $(test -S "$state/nri.sock" && echo present)"

ann='"annotations":{"crisp.dev/sidecars":"proxy","crisp.dev/ready.proxy":"exec:[\"test\",\"-e\",\"/tmp/ready\"]"}'
ctr() { # ctr NAME SCRIPT
  jq -n --arg n "$1" --arg s "$2" '{metadata:{name:$n},image:{image:"crisp.test/busybox:latest"},command:["sh","-c",$s],log_path:($n+".log"),linux:{}}'
}
ctr proxy "trap 'exit 0' TERM; sleep 3; touch /tmp/ready; while true; do sleep 1 & wait \$!; done" >"$state/proxy.json"
ctr app "trap 'sleep 2; exit 0' TERM; echo app up; while true; do sleep 1 & wait \$!; done" >"$state/app.json"
ns() { # RFC 3339 with ns → ns since the epoch
  local s=${1%Z} frac=0
  [[ $s != *.* ]] || { frac=${s#*.}; s=${s%%.*}; }
  frac=${frac%%[+-]*}
  frac=$(printf '%-9s' "$frac" | tr ' ' 0)
  echo $(($(date -u -d "$s" +%s) * 1000000000 + 10#${frac:0:9}))
}
failed=0
for run in $(seq "$runs"); do
  for sock in crio.sock crisp.sock; do
    uid=smoke-$run-${sock%.sock}
    echo "{\"metadata\":{\"name\":\"ordered-$run-${sock%.sock}\",\"namespace\":\"default\",\"uid\":\"$uid\",\"attempt\":0},$ann,\"linux\":{\"security_context\":{\"namespace_options\":{\"network\":2}}},\"log_directory\":\"$state/podlogs/$uid\"}" >"$state/pod.json"
    p=$(c "$sock" runp "$state/pod.json")
    px=$(c "$sock" create "$p" "$state/proxy.json" "$state/pod.json")
    c "$sock" start "$px" >/dev/null
    ap=$(c "$sock" create "$p" "$state/app.json" "$state/pod.json")
    c "$sock" start "$ap" >/dev/null
    sleep 1
    c "$sock" stop -t 15 "$ap" >/dev/null &
    s1=$!
    c "$sock" stop -t 15 "$px" >/dev/null &
    s2=$!
    wait "$s1" "$s2"
    pst=$(c crio.sock inspect "$px" | jq -r .status.startedAt)
    pfi=$(c crio.sock inspect "$px" | jq -r .status.finishedAt)
    acr=$(c crio.sock inspect "$ap" | jq -r .status.createdAt)
    afi=$(c crio.sock inspect "$ap" | jq -r .status.finishedAt)
    create=$((($(ns "$acr") - $(ns "$pst")) / 1000000))
    stop=$((($(ns "$pfi") - $(ns "$afi")) / 1000000))
    mode=direct
    [[ $sock == crio.sock ]] || mode=crisp
    echo "crio-gaps| run $run $mode: proxy started→app created $create ms, app finished→proxy finished $stop ms"
    if [[ $mode == crisp ]] && { [[ $create -lt 2900 ]] || [[ $stop -lt 0 ]]; }; then failed=1; fi
    c "$sock" rmp -f "$p" >/dev/null
  done
done
echo "crio| tap: $(grep -c '"hold"' "$out/tap.jsonl") hold lines, $(grep -c '"method":"CreateContainer"' "$out/tap.jsonl") CreateContainer calls"
[[ $failed -eq 0 ]] || die "a run through crisp was not ordered"
