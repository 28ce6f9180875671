#!/usr/bin/env bash
# Benchmarks crisp against a direct connection and a socat splice in one run, on release builds,
# and writes the report to BENCHMARKS.md (with the command and the machine it ran on).
#
#   sudo hack/bench.sh                 # fake runtime + real containerd
#   sudo hack/bench.sh --no-write      # print only
set -euo pipefail
cd "$(dirname "$0")/.."

write=1
args=(--containerd)
for a in "$@"; do
  case "$a" in
    --no-write) write=0 ;;
    *) args+=("$a") ;;
  esac
done

bash hack/setup.sh >/dev/null
cargo build --release --locked -p crisp -p crisp-e2e --bin crisp --bin crisp-bench
export CRISP_BIN="$PWD/target/release/crisp"
report="$(target/release/crisp-bench "${args[@]}")"

header="# Benchmarks

Produced by \`sudo hack/bench.sh\` (release builds; \`target/release/crisp-bench ${args[*]}\`)
on $(date -u +%Y-%m-%d), $(nproc) cores, $(( $(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2) / 1048576 )) GiB,
$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r).

Three lanes measured in the same run against the same upstream: **direct** (client → runtime),
**socat** (client → \`socat UNIX-LISTEN,fork\` → runtime: a raw byte splice, the floor for any
proxy hop) and **crisp** (client → crisp → runtime). Added latency = lane − direct. The client is
one HTTP/2 connection, like kubelet's.
"
if [[ $write -eq 1 ]]; then
  printf '%s\n%s\n' "$header" "$report" > BENCHMARKS.md
  echo "wrote BENCHMARKS.md"
fi
printf '%s\n' "$report"
