#!/usr/bin/env bash
# Instructions crisp spends relaying grpc-go's unary Version calls, counted by callgrind (perf has
# no instruction counter on these VMs): BENCHMARKS.md, "Relay core with one way out".
#
#   hack/relay-instructions.sh BIN N
#
# Runs crisp BIN under valgrind --tool=callgrind in front of a recording HTTP/2 server
# (`crisp-grpcgo headers`), sends N sequential Version calls on one connection
# (`crisp-grpcgo call --count N`), and prints the program's total and the relay thread's
# (`Pump::run`, inclusive). Per call: (total at N=600 - total at N=100) / 500. With
# CRISP_RELAY_SPLICE=1 in the environment, crisp splices instead (the floor).
# CRISP_GRPCGO_BIN names the grpc-go client (default target/grpcgo/crisp-grpcgo).
#
# It also prints the call's code footprint, what a call fetches again when another process has
# taken the caches between two calls (BENCHMARKS.md, "The code a call runs"): `lines`, the
# distinct 64-byte lines, and `pages`, the distinct 4 KiB pages, holding instructions that ran
# at least N/2 times (every call's path; the start-up's code runs once). Shared libraries'
# code counts too (libc's memcpy, malloc, poll).
set -euo pipefail

bin=$1
n=$2
grpcgo=${CRISP_GRPCGO_BIN:-target/grpcgo/crisp-grpcgo}
dir=$(mktemp -d)
up=""
trap 'if [ -n "$up" ]; then kill "$up" 2> /dev/null || true; fi; rm -rf "$dir"' EXIT

# wait_socket PATH PID: until PATH is a socket, or PID (the process to listen there) has exited.
wait_socket() {
  for _ in $(seq 600); do
    [ -S "$1" ] && return 0
    if ! kill -0 "$2" 2> /dev/null; then
      echo "no socket at $1: the process to listen there exited" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "no socket at $1" >&2
  return 1
}

"$grpcgo" headers --listen "$dir/up.sock" > /dev/null 2>&1 &
up=$!
wait_socket "$dir/up.sock" "$up"
printf 'listen = "%s"\nupstream = "%s"\nstate_dir = "%s"\n[log]\nlevel = "warn"\n' \
  "$dir/crisp.sock" "$dir/up.sock" "$dir/state" > "$dir/crisp.toml"
valgrind --tool=callgrind --dump-instr=yes --dump-line=no --compress-pos=no \
  --compress-strings=no --callgrind-out-file="$dir/cg.out" "$bin" --config "$dir/crisp.toml" \
  > "$dir/crisp.log" 2>&1 &
vg=$!
wait_socket "$dir/crisp.sock" "$vg"
if ! "$grpcgo" call --target "$dir/crisp.sock" --method /runtime.v1.RuntimeService/Version \
  --hex '' --count "$n" > "$dir/call.log" 2>&1; then
  echo "the calls failed:" >&2
  tail -3 "$dir/call.log" >&2
fi
kill -TERM "$vg"
wait "$vg" || true
kill "$up" 2> /dev/null || true
total=$(callgrind_annotate "$dir/cg.out" 2> /dev/null | grep "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,)
pump=$(callgrind_annotate --inclusive=yes "$dir/cg.out" 2> /dev/null | grep "Pump::run" | head -1 \
  | awk '{print $1}' | tr -d ,)
# Cost lines are `0xADDRESS COUNT`; the line after `calls=` is a call's inclusive cost, skipped.
footprint=$(awk -v min=$((n / 2)) '
  function hex(s,   i, v) {
    v = 0
    for (i = 3; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
    return v
  }
  skip { skip = 0; next }
  /^calls=/ { skip = 1; next }
  /^0x/ { ir[$1] += $2 }
  END {
    for (a in ir) if (ir[a] >= min) { v = hex(a); l[int(v / 64)] = 1; p[int(v / 4096)] = 1 }
    for (x in l) nl++
    for (x in p) np++
    printf "lines=%d pages=%d", nl, np
  }' "$dir/cg.out")
echo "$(basename "$bin") N=$n total=$total pump=$pump $footprint"
