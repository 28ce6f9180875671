#!/usr/bin/env bash
# What a diverted call costs, A/B between two crisp builds, on a private real containerd, with
# kubelet's own client (grpc-go, crisp-grpcgo): StopContainer of an unknown container. crisp's
# engine diverts every StopContainer (it may hold a sidecar's), asks the runtime about the
# container with one call of its own (as a probe does) and forwards the call; both go over
# crisp's runtime-side HTTP/2 client. Version (relayed, never diverted) is the control.
# The builds take turns, round by round, so that load on the machine falls on both alike.
#
#   sudo hack/bench-diverted.sh OLD_CRISP NEW_CRISP [ROUNDS] [CALLS]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD="$1"
NEW="$2"
ROUNDS="${3:-5}"
CALLS="${4:-1000}"
GRPCGO="$(bash hack/build-grpcgo.sh)"
DIR="$(mktemp -d /tmp/crisp-divb.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  bash hack/containerd.sh stop "$DIR/containerd" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
bash hack/containerd.sh start "$DIR/containerd" --owner-pid $$ >/dev/null
for lane in old new; do
  bin="$OLD"; [[ "$lane" == new ]] && bin="$NEW"
  printf 'listen = "%s"\nupstream = "%s"\nstate_dir = "%s"\n[admin]\nenabled = false\n' \
    "$DIR/$lane.sock" "$DIR/containerd/containerd.sock" "$DIR/$lane-state" >"$DIR/$lane.toml"
  "$bin" --config "$DIR/$lane.toml" --log-level warn >"$DIR/$lane.log" 2>&1 &
  pids+=($!)
done
for lane in old new; do
  for _ in $(seq 100); do [[ -S "$DIR/$lane.sock" ]] && break; sleep 0.1; done
done
# StopContainerRequest{container_id: "no-such-container", timeout: 1}; VersionRequest{}.
STOP_HEX=0a116e6f2d737563682d636f6e7461696e65721001
call() { # lane method hex
  "$GRPCGO" call --target "$DIR/$1.sock" --method "/runtime.v1.RuntimeService/$2" --hex "$3" \
    --count "$CALLS" --warmup 0 </dev/null | python3 -c 'import json,sys; s=[json.loads(l) for l in sys.stdin if "summary" in l][-1]; print(s["p50_ms"]*1000, s["p99_ms"]*1000, s["ok"]+s["failed"])'
}
echo "| round | method | old p50 µs | new p50 µs | old p99 µs | new p99 µs |"
echo "|---|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
  for m in StopContainer Version; do
    hex="$STOP_HEX"; [[ "$m" == Version ]] && hex=""
    read -r op50 op99 _ < <(call old "$m" "$hex")
    read -r np50 np99 _ < <(call new "$m" "$hex")
    printf '| %s | %s | %.0f | %.0f | %.0f | %.0f |\n' "$r" "$m" "$op50" "$np50" "$op99" "$np99"
  done
done
