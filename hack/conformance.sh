#!/usr/bin/env bash
# Conformance of crisp with the real CRI clients: critest and crictl (cri-tools v1.26.1)
# against a private containerd, once directly and once through crisp.
#
# LOCAL RUN ONLY — not part of .ci/run. It needs the crictl and critest binaries of
# cri-tools v1.26.1, which this project does not vendor and CI cannot fetch. Build them
# from a cri-tools v1.26.1 checkout (tag v1.26.1 = commit 300f0781645f12437b43fba5dd232733e0f2f82f)
# with its vendored modules, offline (Debian's Go 1.19 is enough):
#
#   cd cri-tools && mkdir -p bin
#   export GOFLAGS=-mod=vendor GOPROXY=off GO111MODULE=on CGO_ENABLED=0
#   LD='-X github.com/kubernetes-sigs/cri-tools/pkg/version.Version=1.26.1'
#   go build  -o bin/crictl -ldflags "$LD" -trimpath github.com/kubernetes-sigs/cri-tools/cmd/crictl
#   go test -c -o bin/critest -ldflags "$LD" -trimpath github.com/kubernetes-sigs/cri-tools/cmd/critest
#
# (the same commands as cri-tools' Makefile `crictl`/`critest` targets). Then, as root:
#
#   hack/conformance.sh --crictl PATH --critest PATH [options]
#   CRICTL=PATH CRITEST=PATH hack/conformance.sh [options]
#
# Options:
#   --crictl PATH     crictl v1.26.1 (or env CRICTL)
#   --critest PATH    critest v1.26.1 (or env CRITEST)
#   --crisp PATH      the crisp binary to test (or env CRISP_BIN); default: `cargo build
#                     --locked --bin crisp` here and target/debug/crisp
#   --logs DIR        where every log and report goes (default /var/tmp/crisp-conformance/<time>)
#   --focus REGEX     only critest specs matching REGEX (repeatable; for quick iterations)
#   --no-critest      skip the critest runs (crictl checks only)
#   --no-crictl       skip the crictl checks
#   --no-tap-run      skip the third critest run (through crisp with `crisp tap --full` attached)
# Env CRISP_CONFORMANCE_CONFIG (TOML) is appended to crisp's config, e.g.
#   CRISP_CONFORMANCE_CONFIG=$'[proxy]\nupstream_connections = 1' hack/conformance.sh ...
#
# What it does:
#   1. hack/setup.sh; a private containerd (hack/containerd.sh start --cni, which imports
#      hack/images.sh's crisp.test/busybox and crisp.test/pause); four extra local images
#      (below); crisp in front of it on a private socket, with its admin socket for the tap.
#   2. critest against containerd directly, then through crisp, then through crisp again with
#      `crisp tap --full --all --json` attached (every call observed). Prints
#      "direct: N passed, M failed", "crisp: N passed, M failed", "crisp+tap: ..." and the
#      specs that fail only through crisp (or only directly).
#   3. crictl through crisp: runp, create, start, stop, rm, stopp, rmp of a pod with one
#      container, with crisp's default config and again with `crisp tap --full` attached
#      (checking the tap saw every one of those calls); and `crictl pods / ps -a / images /
#      inspectp / inspect -o json` through crisp compared with the same commands run
#      directly against containerd (lists sorted, keys sorted) while the pod runs.
#   4. Cleans up everything it started (crisp, the taps, containerd, shims, mounts, the CNI
#      bridge) on exit, also on failure or Ctrl-C.
# Exit status: 0 when crisp matches direct (no spec fails only through crisp, all crictl
# checks pass), 1 otherwise, 2 for a usage error or missing crictl/critest.
#
# No registry, no internet: critest's images are replaced as follows.
#   defaultTestContainerImage -> crisp.test/conformance-busybox:latest: hack/images.sh's
#     busybox-static image with hard links instead of symlinks, plus the host's pgrep (procps)
#     and ipcs (util-linux) with their libraries, which the e2e busybox has and Debian's
#     busybox-static lacks (execSync-with-timeout runs pgrep, HostIpc runs ipcs), and
#   webServerTestImage -> crisp.test/conformance-webserver:latest (busybox httpd on :80), both
#     through critest's own --test-images-file;
#   gcr.io/k8s-staging-cri-tools/hostnet-nginx-<arch> (hard-coded: a web server on host port
#     12003) and gcr.io/k8s-staging-cri-tools/test-image-predefined-group (hard-coded: user
#     1000 in group 50000 of /etc/group) are locally built stand-ins imported under those
#     names, with the same contract the specs check. critest only pulls an image that
#     ImageStatus does not find, so none of these is ever pulled.
#   The private containerd's sandbox image crisp.test/pause:latest is re-imported with a
#     pause whose sleeping child is not named "sleep" (see build_images).
# Skipped specs (see SKIPS below), each because it needs a registry or a program that is
# not here, never because of crisp.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"

# --- skips: regex (ginkgo.skip, matched against the full spec text) and why ---------------
SKIPS=(
  'public image with digest'
  #   pulls gcr.io/k8s-staging-cri-tools/test-image-digest@sha256:9700f9a2… — a fixed digest
  #   that only that registry has.
  'Image Manager'
  #   every Image Manager spec (with/without tag, all kinds of references, Uid|Username,
  #   the two listImage specs) removes and then PullImage()s gcr.io test images: no registry.
  'Multiple Containers'
  #   registry.k8s.io/e2e-test-images/httpd:2.4.39-4, hard-coded; the specs grep httpd's own
  #   log line "httpd -D FOREGROUND", which no local image can honestly produce.
  'runtime should support (HostPID|PodPID|ContainerPID)'
  #   registry.k8s.io/e2e-test-images/nginx:1.14-2, hard-coded; the specs look for nginx's
  #   "master process" and /var/run/nginx.pid.
  'NoNewPrivs'
  #   registry.k8s.io/e2e-test-images/nonewprivs:1.3, hard-coded: a setuid test program.
  'runtime should support MaskedPaths'
  #   masks /bin/ls and expects `sh -c ls` to fail with "Permission denied"; Debian's
  #   busybox-static sh runs applets in-process (FEATURE_SH_STANDALONE), so it never
  #   executes /bin/ls and the spec cannot fail or pass on what the runtime did.
)

die_usage() {
  echo "hack/conformance.sh: $*" >&2
  echo "usage: CRICTL=PATH CRITEST=PATH $0 [--crisp PATH] [--logs DIR] [--focus RE] [--no-critest] [--no-crictl] [--no-tap-run]" >&2
  echo "       (crictl/critest v1.26.1: see the header of this script for how to build them offline)" >&2
  exit 2
}
log() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
note() { echo "hack/conformance.sh: $*" >&2; }

CRICTL="${CRICTL:-}"
CRITEST="${CRITEST:-}"
CRISP_BIN="${CRISP_BIN:-}"
LOGS=""
FOCUS=()
DO_CRITEST=1
DO_CRICTL=1
DO_TAP_RUN=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --crictl) [[ $# -ge 2 ]] || die_usage "--crictl needs a path"; CRICTL="$2"; shift 2 ;;
    --critest) [[ $# -ge 2 ]] || die_usage "--critest needs a path"; CRITEST="$2"; shift 2 ;;
    --crisp) [[ $# -ge 2 ]] || die_usage "--crisp needs a path"; CRISP_BIN="$2"; shift 2 ;;
    --logs) [[ $# -ge 2 ]] || die_usage "--logs needs a directory"; LOGS="$2"; shift 2 ;;
    --focus) [[ $# -ge 2 ]] || die_usage "--focus needs a regex"; FOCUS+=("$2"); shift 2 ;;
    --no-critest) DO_CRITEST=0; shift ;;
    --no-crictl) DO_CRICTL=0; shift ;;
    --no-tap-run) DO_TAP_RUN=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die_usage "unknown argument: $1" ;;
  esac
done

missing=()
if [[ $DO_CRICTL -eq 1 ]]; then
  [[ -n "$CRICTL" && -x "$CRICTL" ]] || missing+=("crictl (--crictl PATH or CRICTL=PATH; got '${CRICTL}')")
fi
if [[ $DO_CRITEST -eq 1 ]]; then
  [[ -n "$CRITEST" && -x "$CRITEST" ]] || missing+=("critest (--critest PATH or CRITEST=PATH; got '${CRITEST}')")
fi
if [[ ${#missing[@]} -gt 0 ]]; then
  for m in "${missing[@]}"; do note "missing: $m"; done
  die_usage "this local-only script needs cri-tools v1.26.1's crictl and critest binaries"
fi
[[ "$(id -u)" -eq 0 ]] || die_usage "must run as root (containerd, runc, mounts, CNI need it)"
[[ -z "$CRICTL" ]] || CRICTL="$(readlink -f "$CRICTL")"
[[ -z "$CRITEST" ]] || CRITEST="$(readlink -f "$CRITEST")"
if [[ $DO_CRICTL -eq 1 ]]; then
  v="$("$CRICTL" --version 2>&1 || true)"
  [[ "$v" == *"1.26."* ]] || note "warning: expected crictl 1.26.x, got: $v"
fi
if [[ $DO_CRITEST -eq 1 ]]; then
  v="$("$CRITEST" --version 2>&1 | head -n1 || true)"
  [[ "$v" == *"1.26."* ]] || note "warning: expected critest 1.26.x, got: $v"
fi

LOGS="${LOGS:-/var/tmp/crisp-conformance/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$LOGS"
LOGS="$(cd "$LOGS" && pwd -P)"
note "logs and reports: $LOGS"

# --- state and cleanup ------------------------------------------------------------------
DIR="$(mktemp -d /tmp/crisp-conf.XXXXXX)"
CTRD="$DIR/containerd"
CRISP_PID=""
TAP_PID=""
CRITEST_PID=""
# shared memory segments that exist before this run (see cleanup); "-" when there are none
SHM_BEFORE="$( (ipcs -m 2>/dev/null | awk '$2 ~ /^[0-9]+$/ {print $2}'; echo -) )"
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
  local rc=$?
  set +e
  if [[ -n "$CRITEST_PID" ]]; then kill "$CRITEST_PID" 2>/dev/null; wait "$CRITEST_PID" 2>/dev/null; fi
  if [[ -n "$TAP_PID" ]]; then kill "$TAP_PID" 2>/dev/null; wait "$TAP_PID" 2>/dev/null; fi
  if [[ -n "$CRISP_PID" ]]; then
    kill -TERM "$CRISP_PID" 2>/dev/null
    for _ in $(seq 150); do kill -0 "$CRISP_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CRISP_PID" 2>/dev/null
    wait "$CRISP_PID" 2>/dev/null
  fi
  if [[ -e "$CTRD/containerd.log" ]]; then cp -f "$CTRD/containerd.log" "$LOGS/containerd.log" 2>/dev/null; fi
  # critest's HostIpc specs run `ipcmk -M 1048576` on the host and never remove the
  # segment: drop the unattached 1 MiB segments that appeared during this run.
  if [[ -n "$SHM_BEFORE" ]]; then
    local id
    for id in $(ipcs -m 2>/dev/null | awk '$5 == 1048576 && $6 == 0 {print $2}'); do
      grep -qxF "$id" <<<"$SHM_BEFORE" || ipcrm -m "$id" 2>/dev/null
    done
  fi
  bash hack/containerd.sh stop "$CTRD" >"$LOGS/containerd-stop.log" 2>&1 \
    || note "warning: hack/containerd.sh stop $CTRD failed, see $LOGS/containerd-stop.log"
  # mounts a failed critest spec left under $DIR (mount propagation specs), deepest first
  local mp
  while IFS= read -r mp; do
    umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null
  done < <(awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | tac)
  rm -rf --one-file-system "$DIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. setup: packages, crisp, containerd, images, crisp running ---------------------------
log "setup"
bash hack/setup.sh >&2
command -v python3 >/dev/null || die_usage "python3 is needed (reports, JSON comparison)"

if [[ -z "$CRISP_BIN" ]]; then
  note "building crisp (cargo build --locked --bin crisp)"
  cargo build --locked --bin crisp >"$LOGS/cargo-build.log" 2>&1 \
    || { tail -n 30 "$LOGS/cargo-build.log" >&2; die_usage "cargo build failed"; }
  CRISP_BIN="$ROOT/target/debug/crisp"
fi
CRISP_BIN="$(readlink -f "$CRISP_BIN")"
[[ -x "$CRISP_BIN" ]] || die_usage "crisp binary not found: $CRISP_BIN"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "crisp binary: $CRISP_BIN ($("$CRISP_BIN" --version 2>&1))"
  echo "crisp repo HEAD: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo '?')"
  echo "crisp repo dirty files: $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l)"
  echo "crictl binary: ${CRICTL:-none} ($([[ -n "$CRICTL" ]] && "$CRICTL" --version 2>&1))"
  echo "critest binary: ${CRITEST:-none} ($([[ -n "$CRITEST" ]] && "$CRITEST" --version 2>&1 | head -n1))"
  echo "containerd: $("${CRISP_CONTAINERD_BIN:-containerd}" --version 2>&1)"
  echo "runc: $(runc --version 2>&1 | head -n1)"
  echo "CRISP_CONFORMANCE_CONFIG: ${CRISP_CONFORMANCE_CONFIG:-}"
} >"$LOGS/versions.txt"
cat "$LOGS/versions.txt" >&2

note "starting a private containerd in $CTRD"
bash hack/containerd.sh start "$CTRD" --cni --owner-pid $$ >"$LOGS/containerd-start.log" 2>&1 \
  || { cat "$LOGS/containerd-start.log" >&2; exit 1; }
RUNTIME="$CTRD/containerd.sock"
IMAGE_CACHE="${CRISP_IMAGE_CACHE:-/var/tmp/crisp-images}"
SNAPSHOTTER="$(sed -n 's/^ *snapshotter = "\(.*\)"$/\1/p' "$CTRD/config.toml" | head -n1)"

ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
WEB_IMAGE="crisp.test/conformance-webserver:latest"
HOSTNET_WEB_IMAGE="gcr.io/k8s-staging-cri-tools/hostnet-nginx-$ARCH:latest"
GROUP_IMAGE="gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest"
BUSYBOX_IMAGE="crisp.test/conformance-busybox:latest"
PAUSE_IMAGE="crisp.test/pause:latest" # containerd's sandbox_image (hack/containerd.sh): replaced

# build_images: the four extra images and a replacement pause image, configs (and for the
# busybox and group images one layer each) on top of hack/images.sh's busybox, imported
# into namespace k8s.io under their names.
build_images() {
  local w="$DIR/img" L="$DIR/img/layout"
  mkdir -p "$L"
  tar -xf "$IMAGE_CACHE/busybox.tar" -C "$L"
  # shellcheck disable=SC2016 # $PORT is expanded by the container's sh
  local web='mkdir -p /tmp/www && echo crisp-conformance >/tmp/www/index.html && exec httpd -f -p "$PORT" -h /tmp/www'
  umoci config --image "$L:latest" --tag webserver \
    --config.cmd sh --config.cmd -c --config.cmd "$web" --config.env PORT=80 --config.exposedports 80/tcp
  umoci config --image "$L:latest" --tag hostnet-webserver \
    --config.cmd sh --config.cmd -c --config.cmd "$web" --config.env PORT=12003 --config.exposedports 12003/tcp
  # conformance-busybox: the e2e busybox image critest expects has hard links (MaskedPaths
  # masks /bin/ls; masking a symlink masks /bin/busybox itself) and pgrep and ipcs, which
  # Debian's busybox-static lacks: add the host's own procps pgrep and util-linux ipcs,
  # with the shared libraries they load.
  local r="$w/busybox/rootfs" l b lib
  umoci unpack --image "$L:latest" "$w/busybox" >/dev/null
  cp "$r/bin/busybox" "$r/bin/busybox.new" && mv -f "$r/bin/busybox.new" "$r/bin/busybox"
  while IFS= read -r -d '' l; do
    [[ "$(readlink -f "$l")" == "$r/bin/busybox" ]] && ln -f "$r/bin/busybox" "$l"
  done < <(find "$r" -type l -print0)
  for b in pgrep ipcs; do
    b="$(command -v "$b")" || { echo "hack/conformance.sh: $b not on this host" >&2; return 1; }
    cp -L "$b" "$r/usr/bin/"
    while IFS= read -r lib; do
      [[ -e "$r$lib" ]] && continue
      mkdir -p "$r$(dirname "$lib")"
      cp -L "$lib" "$r$lib"
    done < <(ldd "$b" | grep -o '/[^ ]*' | sort -u)
  done
  if ! chroot "$r" /usr/bin/pgrep --version >/dev/null || ! chroot "$r" /usr/bin/ipcs -V >/dev/null; then
    echo "hack/conformance.sh: pgrep/ipcs do not run in the image's rootfs" >&2
    return 1
  fi
  umoci repack --image "$L:conformance-busybox" "$w/busybox" >/dev/null
  # pause: hack/images.sh's pause sleeps in a child process named "sleep", which a pod's
  # containers see (the pod's PID namespace is shared by default) and critest's
  # "execSync with timeout" counts as a leftover `sleep` (pgrep sleep). The real pause
  # image runs no such process; this one runs `busybox sleep` (comm "busybox").
  # shellcheck disable=SC2016 # $! is expanded by the container's sh
  umoci config --image "$L:latest" --tag pause --clear config.cmd \
    --config.entrypoint /bin/sh --config.entrypoint -c \
    --config.entrypoint 'trap "exit 0" TERM INT; while :; do busybox sleep 86400 & wait $!; done'
  umoci unpack --image "$L:latest" "$w/bundle" >/dev/null
  echo 'default-user:x:1000:1000::/tmp:/bin/sh' >>"$w/bundle/rootfs/etc/passwd"
  printf 'default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n' >>"$w/bundle/rootfs/etc/group"
  umoci repack --image "$L:predefined-group" "$w/bundle" >/dev/null
  umoci config --image "$L:predefined-group" --config.user 1000
  # name each manifest for containerd's importer (io.containerd.image.name)
  python3 - "$L/index.json" "webserver=$WEB_IMAGE" "hostnet-webserver=$HOSTNET_WEB_IMAGE" \
    "predefined-group=$GROUP_IMAGE" "conformance-busybox=$BUSYBOX_IMAGE" "pause=$PAUSE_IMAGE" <<'PY'
import json, sys
path, names = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
idx = json.load(open(path))
out = []
for m in idx["manifests"]:
    tag = m.get("annotations", {}).get("org.opencontainers.image.ref.name")
    if tag in names:
        m["annotations"]["io.containerd.image.name"] = names.pop(tag)
        out.append(m)
assert not names, f"tags not found in {path}: {names}"
idx["manifests"] = out
json.dump(idx, open(path, "w"))
PY
  tar -C "$L" -cf "$w/conformance-images.tar" oci-layout index.json blobs
  ctr --address "$RUNTIME" -n k8s.io images import --snapshotter "$SNAPSHOTTER" \
    "$w/conformance-images.tar" >"$LOGS/images-import.log" 2>&1 \
    || { cat "$LOGS/images-import.log" >&2; return 1; }
  ctr --address "$RUNTIME" -n k8s.io images ls >"$LOGS/images.txt"
}
note "building and importing the conformance images"
build_images

CRISP_SOCK="$DIR/crisp.sock"
ADMIN_SOCK="$DIR/admin.sock"
cat >"$DIR/crisp.toml" <<TOML
listen = "$CRISP_SOCK"
upstream = "$RUNTIME"
state_dir = "$DIR/crisp-state"

[admin]
socket = "$ADMIN_SOCK"
TOML
if [[ -n "${CRISP_CONFORMANCE_CONFIG:-}" ]]; then printf '\n%s\n' "$CRISP_CONFORMANCE_CONFIG" >>"$DIR/crisp.toml"; fi
cp "$DIR/crisp.toml" "$LOGS/crisp.toml"
"$CRISP_BIN" --config "$DIR/crisp.toml" --check-config >"$LOGS/crisp-check-config.txt" 2>&1 \
  || { cat "$LOGS/crisp-check-config.txt" >&2; die_usage "crisp rejected its config"; }

note "starting crisp on $CRISP_SOCK"
"$CRISP_BIN" --config "$DIR/crisp.toml" --log-level "${CRISP_LOG_LEVEL:-info}" >"$LOGS/crisp.log" 2>&1 &
CRISP_PID=$!
for _ in $(seq 200); do
  [[ -S "$CRISP_SOCK" && -S "$ADMIN_SOCK" ]] && break
  kill -0 "$CRISP_PID" 2>/dev/null || { tail -n 30 "$LOGS/crisp.log" >&2; echo "crisp exited at start" >&2; exit 1; }
  sleep 0.05
done
[[ -S "$CRISP_SOCK" ]] || { tail -n 30 "$LOGS/crisp.log" >&2; echo "crisp did not create $CRISP_SOCK" >&2; exit 1; }

# start_tap FILE: `crisp tap --full --all --json` into FILE (every call, decoded).
start_tap() {
  "$CRISP_BIN" tap --admin-socket "$ADMIN_SOCK" --full --all --json >"$1" 2>"$1.stderr" &
  TAP_PID=$!
  sleep 0.5 # let it attach before the first call
  kill -0 "$TAP_PID" 2>/dev/null || { cat "$1.stderr" >&2; echo "crisp tap did not start" >&2; exit 1; }
}
stop_tap() {
  sleep 0.5 # the last events
  kill "$TAP_PID" 2>/dev/null || true
  wait "$TAP_PID" 2>/dev/null || true
  TAP_PID=""
}
# tap_summary FILE LABEL: events, dropped, per-method counts and status codes.
tap_summary() {
  python3 - "$1" "$2" <<'PY'
import collections, json, sys
label = sys.argv[2]
calls, dropped, bad, by_method, codes = 0, 0, 0, collections.Counter(), collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if not line:
        continue
    try:
        ev = json.loads(line)
    except ValueError:
        bad += 1
        continue
    if "dropped" in ev:
        dropped += ev["dropped"]
        continue
    calls += 1
    by_method[ev.get("method") or ev.get("path")] += 1
    codes[ev.get("code_name") or str(ev.get("code"))] += 1
print(f"{label}: {calls} calls observed, {dropped} events dropped, {bad} unparsable lines")
print(f"{label}: status codes: " + ", ".join(f"{k}={v}" for k, v in sorted(codes.items())))
print(f"{label}: per method: " + ", ".join(f"{k}={v}" for k, v in sorted(by_method.items())))
PY
}

# --- 2. critest -------------------------------------------------------------------------
# report_summary LABEL JSON_REPORT: prints "LABEL: N passed, M failed, K skipped" and writes
# the sorted failed spec names to JSON_REPORT.failed (first lines of each message to .msgs).
report_summary() {
  python3 - "$1" "$2" <<'PY'
import json, sys
label, path = sys.argv[1], sys.argv[2]
try:
    suites = json.load(open(path))
except Exception as e:  # no report: critest died before writing one
    print(f"{label}: no report ({e})")
    open(path + ".failed", "w").close()
    sys.exit(0)
n = {"passed": 0, "failed": 0, "skipped": 0, "other": 0}
failed, msgs = [], []
for suite in suites:
    for s in suite.get("SpecReports") or []:
        if s.get("LeafNodeType") != "It":
            if s.get("State") not in ("passed", "skipped"):
                t = s.get("LeafNodeType")
                failed.append(f"[{t}]")
                msgs.append(f"[{t}]: {(s.get('Failure') or {}).get('Message', '')[:600]}")
            continue
        name = " ".join((s.get("ContainerHierarchyTexts") or []) + [s.get("LeafNodeText", "")])
        st = s.get("State")
        if st == "passed":
            n["passed"] += 1
        elif st in ("skipped", "pending"):
            n["skipped"] += 1
        else:
            n["failed"] += 1
            failed.append(name)
            f = s.get("Failure") or {}
            loc = f.get("Location") or {}
            msgs.append(f"{name}\n    [{st}] {loc.get('FileName','?').split('/')[-1]}:{loc.get('LineNumber','?')}: "
                        + " ".join(f.get("Message", "").split())[:600])
print(f"{label}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped")
open(path + ".failed", "w").write("".join(x + "\n" for x in sorted(failed)))
open(path + ".msgs", "w").write("".join(x + "\n" for x in msgs))
PY
}

CRITEST_ARGS=(
  --test-images-file "$DIR/test-images.yaml"
  --ginkgo.no-color
  --ginkgo.timeout 2h
  -test.timeout 0
)
for s in "${SKIPS[@]}"; do CRITEST_ARGS+=(--ginkgo.skip "$s"); done
for f in "${FOCUS[@]+"${FOCUS[@]}"}"; do CRITEST_ARGS+=(--ginkgo.focus "$f"); done
cat >"$DIR/test-images.yaml" <<YAML
defaultTestContainerImage: $BUSYBOX_IMAGE
webServerTestImage: $WEB_IMAGE
YAML
cp "$DIR/test-images.yaml" "$LOGS/test-images.yaml"
printf '%s\n' "${SKIPS[@]}" >"$LOGS/critest-skips.txt"

# run_critest NAME ENDPOINT: one full critest run; log, JSON and JUnit reports in $LOGS.
run_critest() {
  local name="$1" ep="$2" rc=0 t0
  mkdir -p "$DIR/critest-$name"
  t0=$SECONDS
  note "critest ($name) against $ep — log $LOGS/critest-$name.log"
  # TMPDIR: critest's pod log dirs, seccomp profiles and volume dirs land under $DIR (it
  # leaves them behind when a spec fails), so cleanup removes them.
  mkdir -p "$DIR/critest-$name/tmp"
  # in the background so that a signal to this script is handled at once (bash runs traps
  # only between commands, and `wait` is interruptible); cleanup kills it.
  (cd "$DIR/critest-$name" && TMPDIR="$DIR/critest-$name/tmp" exec "$CRITEST" \
    --runtime-endpoint "unix://$ep" --image-endpoint "unix://$ep" \
    --ginkgo.json-report "$LOGS/critest-$name.json" \
    --ginkgo.junit-report "$LOGS/critest-$name.xml" \
    "${CRITEST_ARGS[@]}") >"$LOGS/critest-$name.log" 2>&1 &
  CRITEST_PID=$!
  wait "$CRITEST_PID" || rc=$?
  CRITEST_PID=""
  note "critest ($name) exited $rc after $((SECONDS - t0)) s"
  report_summary "$name" "$LOGS/critest-$name.json" | tee -a "$LOGS/summary.txt"
}

# compare_failures A B: specs that fail in B but not in A, and the other way round.
compare_failures() {
  local a="$1" b="$2" only_b only_a
  only_b="$(comm -13 "$LOGS/critest-$a.json.failed" "$LOGS/critest-$b.json.failed")"
  only_a="$(comm -23 "$LOGS/critest-$a.json.failed" "$LOGS/critest-$b.json.failed")"
  {
    echo "failing only in '$b' ($(grep -c . <<<"$only_b" || true)):"
    [[ -z "$only_b" ]] || printf '  %s\n' "${only_b//$'\n'/$'\n'  }"
    echo "failing only in '$a' ($(grep -c . <<<"$only_a" || true)):"
    [[ -z "$only_a" ]] || printf '  %s\n' "${only_a//$'\n'/$'\n'  }"
  } | tee -a "$LOGS/summary.txt"
  [[ -z "$only_b" ]]
}

OK=1
if [[ $DO_CRITEST -eq 1 ]]; then
  log "critest directly against containerd"
  run_critest direct "$RUNTIME"
  log "critest through crisp"
  run_critest crisp "$CRISP_SOCK"
  log "critest: direct vs crisp"
  compare_failures direct crisp || OK=0
  if [[ -s "$LOGS/critest-crisp.json.msgs" ]]; then
    echo "first failures through crisp (all in $LOGS/critest-crisp.json.msgs):"
    head -n 10 "$LOGS/critest-crisp.json.msgs" | cut -c1-400
  fi
  if [[ $DO_TAP_RUN -eq 1 ]]; then
    log "critest through crisp with crisp tap --full attached"
    start_tap "$LOGS/tap-critest.jsonl"
    run_critest crisp+tap "$CRISP_SOCK"
    stop_tap
    tap_summary "$LOGS/tap-critest.jsonl" tap-critest | tee -a "$LOGS/summary.txt"
    compare_failures direct crisp+tap || OK=0
  fi
fi

# --- 3. crictl --------------------------------------------------------------------------
crictl_cfg() {
  cat >"$DIR/crictl-$1.yaml" <<YAML
runtime-endpoint: unix://$2
image-endpoint: unix://$2
timeout: 30
debug: false
pull-image-on-create: false
disable-pull-on-run: true
YAML
}
crictl_cfg direct "$RUNTIME"
crictl_cfg crisp "$CRISP_SOCK"
# cc WHICH ARGS...: crictl against direct|crisp, output to stdout, errors to the step log
cc() {
  local which="$1"
  shift
  "$CRICTL" --config "$DIR/crictl-$which.yaml" "$@"
}

CRICTL_FAIL=0
# step NAME CMD...: run, log the command and its output, count failures.
step() {
  local name="$1" out rc=0
  shift
  out="$("$@" 2>&1)" || rc=$?
  printf '$ %s\n%s\n(exit %d)\n' "$*" "$out" "$rc" >>"$CRICTL_LOG"
  if [[ $rc -eq 0 ]]; then
    echo "  ok    $name" | tee -a "$LOGS/summary.txt"
  else
    echo "  FAIL  $name: $(head -c 300 <<<"$out" | tr '\n' ' ')" | tee -a "$LOGS/summary.txt"
    CRICTL_FAIL=$((CRICTL_FAIL + 1))
  fi
  STEP_OUT="$out"
  return $rc
}

# normalize: crictl JSON with every list sorted and keys sorted, so that map order and
# list order (which the CRI does not define) never count as differences.
normalize() {
  python3 -c '
import json, sys
def norm(v):
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return sorted((norm(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True))
    return v
print(json.dumps(norm(json.load(sys.stdin)), indent=1, sort_keys=True))'
}

# compare WHAT ARGS...: `crictl ARGS -o json` direct vs through crisp, normalized.
compare() {
  local what="$1" rc=0
  shift
  local d="$LOGS/crictl/$what.direct.json" c="$LOGS/crictl/$what.crisp.json"
  # `-o json` right after the subcommand: crictl stops parsing flags at the first argument
  if ! cc direct "$1" -o json "${@:2}" 2>>"$CRICTL_LOG" | normalize >"$d" 2>>"$CRICTL_LOG"; then rc=1; fi
  if ! cc crisp "$1" -o json "${@:2}" 2>>"$CRICTL_LOG" | normalize >"$c" 2>>"$CRICTL_LOG"; then rc=1; fi
  if [[ $rc -eq 0 ]] && diff -u "$d" "$c" >"$LOGS/crictl/$what.diff"; then
    echo "  same  crictl $* -o json ($(wc -l <"$d") lines)" | tee -a "$LOGS/summary.txt"
    rm -f "$LOGS/crictl/$what.diff"
  else
    echo "  DIFF  crictl $* -o json: see $LOGS/crictl/$what.diff" | tee -a "$LOGS/summary.txt"
    diff -u "$d" "$c" >"$LOGS/crictl/$what.diff" || true
    CRICTL_FAIL=$((CRICTL_FAIL + 1))
  fi
}

# lifecycle NAME: one pod with one container through crisp, every step checked, and the
# listings compared with containerd's while it runs.
lifecycle() {
  local name="$1" pod ctr
  local cfg="$DIR/crictl/$name"
  mkdir -p "$cfg" "$DIR/pods/$name"
  cat >"$cfg/pod.json" <<JSON
{
  "metadata": {"name": "conformance-$name", "namespace": "crisp-conformance", "uid": "crisp-conformance-$name-$$", "attempt": 0},
  "hostname": "conformance-$name",
  "log_directory": "$DIR/pods/$name",
  "labels": {"app": "crisp-conformance", "run": "$name"},
  "annotations": {"crisp.dev/test": "conformance"},
  "linux": {}
}
JSON
  cat >"$cfg/container.json" <<JSON
{
  "metadata": {"name": "app", "attempt": 0},
  "image": {"image": "$BUSYBOX_IMAGE"},
  "command": ["sh", "-c", "trap 'exit 0' TERM; echo started; while :; do sleep 1; done"],
  "envs": [{"key": "CRISP_CONFORMANCE", "value": "$name"}],
  "labels": {"app": "crisp-conformance"},
  "log_path": "app.log",
  "linux": {}
}
JSON
  echo "crictl lifecycle through crisp ($name):" | tee -a "$LOGS/summary.txt"
  step "runp" cc crisp runp "$cfg/pod.json" || return 0
  pod="$STEP_OUT"
  step "create" cc crisp create --no-pull "$pod" "$cfg/container.json" "$cfg/pod.json" || { cc direct rmp -f "$pod" >/dev/null 2>&1; return 0; }
  ctr="$STEP_OUT"
  step "start" cc crisp start "$ctr" || true
  compare "pods-$name" pods
  compare "ps-$name" ps -a
  compare "images-$name" images
  compare "inspectp-$name" inspectp "$pod"
  compare "inspect-$name" inspect "$ctr"
  step "stop" cc crisp stop --timeout 10 "$ctr" || true
  compare "ps-stopped-$name" ps -a
  step "rm" cc crisp rm "$ctr" || true
  step "stopp" cc crisp stopp "$pod" || true
  step "rmp" cc crisp rmp "$pod" || true
  # nothing of it may be left, whatever failed above
  if [[ -n "$(cc direct pods -q --label "run=$name" 2>/dev/null)" ]]; then
    echo "  FAIL  pod of '$name' still there after rmp" | tee -a "$LOGS/summary.txt"
    CRICTL_FAIL=$((CRICTL_FAIL + 1))
    cc direct rmp -f "$pod" >/dev/null 2>&1 || true
  fi
}

if [[ $DO_CRICTL -eq 1 ]]; then
  mkdir -p "$LOGS/crictl"
  CRICTL_LOG="$LOGS/crictl/commands.log"
  log "crictl through crisp"
  step "version through crisp" cc crisp version || true
  lifecycle default
  log "crictl through crisp with crisp tap --full attached"
  start_tap "$LOGS/tap-crictl.jsonl"
  step "version through crisp (tap)" cc crisp version || true
  step "pods through crisp (tap)" cc crisp pods || true
  lifecycle tap
  stop_tap
  tap_summary "$LOGS/tap-crictl.jsonl" tap-crictl | tee -a "$LOGS/summary.txt"
  for m in Version ListPodSandbox RunPodSandbox CreateContainer StartContainer StopContainer RemoveContainer StopPodSandbox RemovePodSandbox; do
    if grep -Eq "\"method\": ?\"$m\"" "$LOGS/tap-crictl.jsonl"; then
      echo "  ok    tap saw $m" | tee -a "$LOGS/summary.txt"
    else
      echo "  FAIL  tap did not see $m" | tee -a "$LOGS/summary.txt"
      CRICTL_FAIL=$((CRICTL_FAIL + 1))
    fi
  done
  echo "crictl: $CRICTL_FAIL check(s) failed" | tee -a "$LOGS/summary.txt"
  [[ $CRICTL_FAIL -eq 0 ]] || OK=0
fi

log "summary (details: $LOGS/summary.txt)"
grep -E '^(direct|crisp|crisp\+tap|tap-critest|tap-crictl|crictl): |^failing only' "$LOGS/summary.txt" || true
if [[ $OK -eq 1 ]]; then
  echo "conformance: crisp matches containerd"
  exit 0
fi
echo "conformance: crisp differs from containerd (logs: $LOGS)"
exit 1
