#!/usr/bin/env bash
# Builds crisp-grpcgo (e2e/go/grpcgo/main.go): real grpc-go peers for the end-to-end tests — a
# kubelet-style grpc-go client and a grpc-go server (containerd's transport) — to
# target/grpcgo/crisp-grpcgo.
#
# Offline: Debian's golang-go and golang-google-grpc-dev (grpc-go 1.33, sources under
# /usr/share/gocode/src), built in GOPATH mode; the Go module proxy is never used. Installs
# nothing (hack/setup.sh does). Idempotent: does nothing when the binary is newer than the
# source and this script.
#
#   hack/build-grpcgo.sh          # prints the binary's path
#   hack/build-grpcgo.sh --force  # rebuild
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$SELF")/.."
ROOT="$PWD"

SRC="$ROOT/e2e/go/grpcgo/main.go"
GOPATH_DIR="${CRISP_GOPATH:-/usr/share/gocode}"
OUT_DIR="$ROOT/target/grpcgo"
OUT="$OUT_DIR/crisp-grpcgo"

die() {
  echo "hack/build-grpcgo.sh: error: $*" >&2
  exit 1
}

force=0
[[ "${1:-}" == "--force" ]] && force=1

if [[ "$force" -eq 0 && -x "$OUT" && "$OUT" -nt "$SRC" && "$OUT" -nt "$SELF" ]]; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null 2>&1 || die "'go' not found: install golang-go (hack/setup.sh does)"
for pkg in google.golang.org/grpc golang.org/x/net/http2; do
  [[ -d "$GOPATH_DIR/src/$pkg" ]] \
    || die "$GOPATH_DIR/src/$pkg missing: install golang-google-grpc-dev (hack/setup.sh does)"
done

mkdir -p "$OUT_DIR"
tmp="$(mktemp "$OUT_DIR/.crisp-grpcgo.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
# GOPATH mode against the distro's sources only: no modules, no proxy, no network.
env GO111MODULE=off GOPATH="$GOPATH_DIR" GOFLAGS= GOPROXY=off GOTOOLCHAIN=local \
  GOCACHE="$OUT_DIR/cache" CGO_ENABLED=0 \
  go build -trimpath -o "$tmp" "$SRC" \
  || die "go build $SRC failed"
chmod 0755 "$tmp"
mv -f "$tmp" "$OUT"
trap - EXIT
echo "$OUT"
