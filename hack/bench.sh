#!/usr/bin/env bash
# Benchmarks crisp against a direct connection and a socat splice in one run, on release builds,
# and writes the report into BENCHMARKS.md's generated section (with the command, the machine and
# the commit it ran on); the analysis around that section is left as it is.
#
# kubelet's own client comes first: `crisp-grpcgo bench` (grpc-go 1.33, dialing as kubelet does)
# against direct / socat / crisp / crisp-splice (the same crisp with CRISP_RELAY_SPLICE=1: its
# threads and sockets without its protocol work, the machine's floor for crisp), the lanes
# interleaved call by call (a new random order each round), several runs, each figure
# as min / median / max over the runs (Version and ListContainers on real containerd; Version,
# a 10,000-container ListContainers and concurrency 64 on the fake runtime), with crisp's CPU
# and wakeups per call, then what crisp does per call over its floor, counted by callgrind
# (instructions and code lines: hack/relay-instructions.sh; valgrind is installed if missing).
# The hyper-client and fake-runtime lanes follow as secondary tables.
# The whole run takes 3–6 minutes.
#
#   sudo hack/bench.sh                              # fake runtime + real containerd
#   sudo hack/bench.sh --no-write                   # print only
#   sudo hack/bench.sh --no-write --only kubelet    # only the grpc-go tables
#   sudo hack/bench.sh --no-write --only throughput --rounds 5   # one workload (crisp-bench --help)
#   sudo CRISP_BEFORE_BIN=/path/to/old/crisp hack/bench.sh --only kubelet
#       # adds a "crisp-before" lane, interleaved with the others: before/after from one run
#   sudo hack/bench.sh --no-write --only relist     # kubelet's relist at a node's limits
#       # (issue #47): ListPodSandbox then ListContainers from grpc-go against a fake node of
#       # 500 pods / 2,000 containers and of 10,000 containers (~15 MB), direct / socat / crisp /
#       # socat -b 65536 interleaved relist by relist, 3 runs (--relist-runs, --relist-calls,
#       # --relist-pace-ms); CPU and context switches per relist of crisp and both splices and
#       # crisp's RSS, from /proc; the machine it ran on. ~4 minutes (BENCHMARKS.md, issue #47).
#   sudo hack/bench.sh --no-write --only burst      # a burst of ordered pods (issue #47): 100
#       # pods at once through crisp, each a sidecar with an exec readiness the fake runtime
#       # turns ready at a known instant and an app crisp holds, while grpc-go relists; per pod
#       # the time from ready to the app's CreateContainer leaving crisp, the ExecSync rate,
#       # the relist quiet vs during the burst; 5 runs (--burst-runs, --burst-pods,
#       # --burst-ready-ms, --burst-relists, --burst-relist-pace-ms; --crisp-config to lift a
#       # budget). ~1.5 minutes.
#   sudo hack/bench.sh --no-write --only ownwork    # crisp's own work at 500 and 2,500 pods
#       # (issue #47) on the relist lane's fake node: its recovery at start (with and without
#       # Job-mode marks), Job mode's status check, `crisp tap --json --all` during the relist,
#       # `crisp pods` (every pod, one pod). --relist-runs runs. ~5 minutes.
#   sudo hack/bench.sh --no-write --only ctrd-relist  # the relist lane on a real containerd
#       # filled with --ctrd-pods pods (300: a host-network sandbox and a busybox container
#       # each), direct / socat / crisp / socat-64k interleaved, --relist-runs runs of
#       # --ctrd-relists relists. Several minutes (filling and emptying containerd).
#
# Builds go to $CARGO_TARGET_DIR when it is set (else target/).
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
# kubelet's own gRPC client for the grpc-go workload (crisp-bench --only grpcgo).
bash hack/build-grpcgo.sh >/dev/null
# callgrind, for the per-call count after the grpc-go tables; without it the report says the
# count was skipped, and the timed lanes still run.
command -v valgrind > /dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind > /dev/null ||
  echo "hack/bench.sh: valgrind could not be installed: the per-call count is skipped" >&2
cargo build --release --locked -p crisp -p crisp-e2e --bin crisp --bin crisp-bench
release="${CARGO_TARGET_DIR:-$PWD/target}/release"
export CRISP_BIN="$release/crisp"
# The host's steal time during the run: on a shared VM the neighbours' load moves every lane.
steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
read -r s0 t0 < <(steal)
report="$("$release/crisp-bench" "${args[@]}")"
read -r s1 t1 < <(steal)
stolen=$(( t1 > t0 ? 100 * (s1 - s0) / (t1 - t0) : 0 ))

header="Produced by \`sudo hack/bench.sh\` (release builds; \`target/release/crisp-bench ${args[*]}\`)
on $(date -u +%Y-%m-%d), $(nproc) cores, $(( $(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2) / 1048576 )) GiB,
$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), kernel $(uname -r), crisp $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)'),
${stolen} % of the CPU time stolen by the host during the run."
generated="$(printf '%s\n%s\n' "$header" "$report")"
if [[ $write -eq 1 ]]; then
  # Only the generated section between the markers is replaced: the analysis around it stays.
  begin='<!-- bench.sh: begin generated -->'
  end='<!-- bench.sh: end generated -->'
  if [[ -f BENCHMARKS.md ]] && grep -qF "$begin" BENCHMARKS.md && grep -qF "$end" BENCHMARKS.md; then
    printf '%s\n' "$generated" > BENCHMARKS.md.gen
    awk -v b="$begin" -v e="$end" '
      $0 == b { print; while ((getline l < "BENCHMARKS.md.gen") > 0) print l; skip = 1; next }
      $0 == e { skip = 0 }
      !skip { print }' BENCHMARKS.md > BENCHMARKS.md.new
    mv BENCHMARKS.md.new BENCHMARKS.md
    rm -f BENCHMARKS.md.gen
  else
    printf '# Benchmarks\n\n%s\n%s\n%s\n' "$begin" "$generated" "$end" > BENCHMARKS.md
  fi
  echo "wrote the generated section of BENCHMARKS.md"
fi
printf '%s\n' "$generated"
