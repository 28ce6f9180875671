#!/bin/bash
# hack/relay-instructions.sh BIN N: instructions of crisp BIN relaying N unary Version calls (grpc-go, one connection)
# to a recording HTTP/2 server, under callgrind; prints the program total and Pump::run inclusive.
set -u
BIN=$1; N=$2; G=${CRISP_GRPCGO_BIN:-target/grpcgo/crisp-grpcgo}
D=$(mktemp -d)
$G headers --listen $D/up.sock > /dev/null 2>&1 & UP=$!
for i in $(seq 100); do [ -S $D/up.sock ] && break; sleep 0.1; done
printf 'listen = "%s"\nupstream = "%s"\nstate_dir = "%s"\n[log]\nlevel = "warn"\n' $D/crisp.sock $D/up.sock $D/state > $D/crisp.toml
valgrind --tool=callgrind --callgrind-out-file=$D/cg.out $BIN --config $D/crisp.toml > $D/crisp.log 2>&1 & VG=$!
for i in $(seq 600); do [ -S $D/crisp.sock ] && break; sleep 0.1; done
$G call --target $D/crisp.sock --method /runtime.v1.RuntimeService/Version --hex '' --count $N > $D/call.log 2>&1 || { echo "call failed"; cat $D/call.log | tail -3; }
kill -TERM $VG; wait $VG
kill $UP 2>/dev/null
total=$(callgrind_annotate $D/cg.out 2>/dev/null | grep "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,)
pump=$(callgrind_annotate --inclusive=yes $D/cg.out 2>/dev/null | grep "Pump::run" | head -1 | awk '{print $1}' | tr -d ,)
echo "$(basename $BIN) N=$N total=$total pump=$pump"
