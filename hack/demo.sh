#!/usr/bin/env bash
# crisp's main job, end to end, on this machine: a private containerd (real runc containers,
# locally built busybox images, CNI pod networking), crisp in front of it, and the kubelet
# emulator (kubelet 1.26's CRI call sequences) running one pod whose proxy sidecar needs 3 s to
# get ready and is listed *after* the app.
#
# The pod runs twice: first with kubelet talking to containerd directly (what a 1.2x node does
# today), then through crisp. Compare the two CRI timelines.
#
#   sudo hack/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }

bash hack/setup.sh
bold "building crisp and the kubelet emulator"
cargo build --locked --workspace --bins 2>&1 | tail -1
# kubelet's own gRPC stack (grpc-go): kubelet-emu sends its calls through it when it is built.
bash hack/build-grpcgo.sh >/dev/null

DIR="$(mktemp -d /tmp/crisp-demo.XXXXXX)"
CRISP_PID=""
TAP_PID=""
REC_PID=""
# Where the second run's tap recording and its timeline picture are left for you to open.
OUT="${CRISP_DEMO_OUT:-target/demo}"
cleanup() {
  if [[ -n "$TAP_PID" ]]; then kill "$TAP_PID" 2>/dev/null || true; fi
  if [[ -n "$REC_PID" ]]; then kill "$REC_PID" 2>/dev/null || true; fi
  if [[ -n "$CRISP_PID" ]] && kill "$CRISP_PID" 2>/dev/null; then
    wait "$CRISP_PID" 2>/dev/null || true
  fi
  bash hack/containerd.sh stop "$DIR/containerd" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

bold "starting a private containerd in $DIR/containerd"
bash hack/containerd.sh start "$DIR/containerd" --cni --owner-pid $$ >/dev/null
RUNTIME="$DIR/containerd/containerd.sock"

cat > "$DIR/crisp.toml" <<TOML
listen = "$DIR/crisp.sock"
upstream = "$RUNTIME"
state_dir = "$DIR/state"
[admin]
socket = "$DIR/admin.sock"
TOML
if ! target/debug/crisp --config "$DIR/crisp.toml" --check-config >/dev/null 2>&1; then
  # A build without the admin API: run without that section.
  sed -i '/^\[admin\]/,$d' "$DIR/crisp.toml"
fi

EMU=(target/debug/kubelet-emu run e2e/pods/demo.yaml --delete-after-running 2 --pod-log-dir "$DIR/pods")

bold "1) WITHOUT crisp: kubelet → containerd"
echo "   (watch the app's CreateContainer/StartContainer come right after the proxy's, before it is ready,"
echo "    and both StopContainer calls return together)"
"${EMU[0]}" --endpoint "$RUNTIME" "${EMU[@]:1}"

bold "2) WITH crisp: kubelet → crisp → containerd"
target/debug/crisp --config "$DIR/crisp.toml" --log-level info >"$DIR/crisp.log" 2>&1 &
CRISP_PID=$!
for _ in $(seq 100); do [[ -S "$DIR/crisp.sock" ]] && break; sleep 0.05; done
if [[ -S "$DIR/admin.sock" ]] || grep -q admin "$DIR/crisp.toml"; then
  for _ in $(seq 100); do [[ -S "$DIR/admin.sock" ]] && break; sleep 0.05; done
  target/debug/crisp tap --admin-socket "$DIR/admin.sock" >"$DIR/tap.log" 2>&1 &
  TAP_PID=$!
  # A second tap records every call, polling ones too (ImageStatus), for `crisp timeline`;
  # --force replaces the recording of an earlier run (without it the tap refuses the file, and
  # the pictures below would be drawn from that old run).
  mkdir -p "$OUT"
  target/debug/crisp tap --admin-socket "$DIR/admin.sock" --all --json --force \
    -o "$OUT/calls.jsonl" >/dev/null 2>"$DIR/rec.log" &
  REC_PID=$!
  for _ in $(seq 100); do grep -q attached "$DIR/rec.log" 2>/dev/null && break; sleep 0.05; done
  if ! grep -q attached "$DIR/rec.log" 2>/dev/null; then
    echo "hack/demo.sh: the recording tap did not attach:" >&2
    cat "$DIR/rec.log" >&2
    exit 1
  fi
fi
echo "   (crisp refuses the app until the proxy exists, holds its CreateContainer until the proxy"
echo "    answers HTTP on the pod IP, and holds the proxy's StopContainer until the app has exited)"
"${EMU[0]}" --endpoint "$DIR/crisp.sock" "${EMU[@]:1}"

bold "what crisp logged"
# One line per decision: the RPC, the container, and what crisp did.
grep -E 'holding|refusing|forwarding|sidecars ready' "$DIR/crisp.log" \
  | sed -E 's/^[^ ]+ +INFO rpc\{rpc=([^ ]+).*container_name="?([^" }]*)"?.*\}: crisp::[a-z_:]+: /  \1 \2: /' | cut -c1-200 || true
if [[ -n "$TAP_PID" ]]; then
  bold "crisp tap (the live CRI view of the second run; polling calls hidden)"
  sleep 0.5
  kill "$TAP_PID" 2>/dev/null || true
  TAP_PID=""
  cat "$DIR/tap.log"
  kill "$REC_PID" 2>/dev/null || true
  REC_PID=""
  bold "crisp timeline (the demo pod's CRI calls as a waterfall; ░ = held by crisp)"
  target/debug/crisp timeline --pod demo/web --svg "$OUT/web-timeline.svg" "$OUT/calls.jsonl"
  echo
  echo "   the same as a picture: $OUT/web-timeline.svg (open it in a browser; hover a bar for details)"
  # Who waited for whom: kubelet, crisp and containerd as lanes; Mermaid text for an issue.
  target/debug/crisp timeline --sequence --pod demo/web --svg "$OUT/web-sequence.svg" \
    "$OUT/calls.jsonl" >"$OUT/web-sequence.mmd"
  echo "   as a sequence (kubelet → crisp → containerd, holds as gaps): $OUT/web-sequence.svg,"
  echo "   and as Mermaid text to paste into an issue: $OUT/web-sequence.mmd"
fi
bold "done — see docs/ANNOTATIONS.md for the annotations and docs/CALLS.md for what each hold means"
