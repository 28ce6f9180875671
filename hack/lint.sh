#!/usr/bin/env bash
# Formatting and lints, as CI checks them: `cargo fmt --check` (rustfmt.toml) and clippy on every
# target with warnings as errors. Run before committing; hack/test.sh runs it first.
#
#   hack/lint.sh          # check
#   hack/lint.sh --fix    # format, then check
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--fix" ]]; then
  cargo fmt --all
fi
if ! cargo fmt --all -- --check >/dev/null; then
  echo "hack/lint.sh: cargo fmt would change these files (run hack/lint.sh --fix):" >&2
  cargo fmt --all -- --check -l >&2 || true
  exit 1
fi
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "hack/lint.sh: fmt and clippy clean"
