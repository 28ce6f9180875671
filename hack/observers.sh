#!/usr/bin/env bash
# What each way of seeing a node's CRI traffic shows and costs, measured on one workload
# (issue #46; docs/TAP.md, "Beside the other ways to see CRI traffic"). LOCAL RUN ONLY — not
# part of .ci/run: it needs root, bpftrace and tracefs, and its figures move with the machine.
#
# The workload is kubelet's own client library (crisp-grpcgo bench: grpc-go 1.33, dialing as
# kubelet does) making unary calls against a private real containerd (hack/containerd.sh) that
# runs PODS host-network pods of two busybox containers each: every turn is kubelet's steady
# state, Version, ListPodSandbox, ListContainers, PodSandboxStatus and ContainerStatus (the pods
# and containers are created first, through the tapped crisp, with a secret in one env value, so
# that the tap's recording shows what it does with it; those calls are not measured).
#
# The configurations:
#   direct      client → containerd, nothing observing
#   crisp       client → crisp → containerd, no tap attached
#   crisp-tap   client → a second crisp → containerd, with `crisp tap --json --full --all`
#               attached, writing to a file (--tap sets its flags)
#       These three are lanes of one `crisp-grpcgo bench`, interleaved call by call (a new random
#       lane order every turn), --runs runs of --turns turns each; crisp's and the tap's CPU from
#       /proc/PID/stat around the measured calls of every run (--watch).
#   uprobe      client → containerd with bpftrace attached to the client's grpc-go: a uprobe on
#               grpc.(*ClientConn).Invoke (the method string, from its registers) and one on
#               grpc.(*clientStream).finish (the end of the call, nil error or not), matched by
#               goroutine (R14), one printf line per call into a file — the mechanism of eBPF
#               gRPC tracers such as Inspektor Gadget's. No uretprobe: on a Go program it
#               kills the client (SIGILL; goroutines move between threads, docs/TAP.md).
#               A uprobe traps in every process of the binary, so it cannot be a lane beside the
#               others: each of --runs rounds runs one bench process with it and one without
#               (order alternating), on a private copy of crisp-grpcgo (uprobes attach to an
#               inode: nobody else's crisp-grpcgo is touched). bpftrace's CPU from /proc, the
#               client's own (the probes run in its context) from bash's `time`.
#   crictl      `crictl ps` vs `crictl --debug ps` against the same containerd, interleaved
#               --crictl-runs times: wall time and bytes printed (it sees only its own calls).
#   sockdump    eBPF kprobes on unix_stream_sendmsg: tried (bpftrace's kprobe, and sockdump.py
#               itself with --sockdump), and its error reported when this kernel cannot.
#
#   sudo hack/observers.sh                       # 5 runs of 1000 turns (5 calls a turn), ~3 min
#   sudo hack/observers.sh --runs 7 --turns 2000 --pods 5
#   sudo hack/observers.sh --crictl /var/tmp/cri-tools/bin/crictl --sockdump /path/sockdump.py
#   sudo hack/observers.sh --tap "--json --all"  # the tap's flags (default: --json --full --all)
#   sudo hack/observers.sh --keep DIR            # keep the raw files (bench JSON, tap recording,
#                                                # bpftrace output) in DIR
#
# Prints a Markdown report (the table docs/TAP.md carries) with the date, commit and load
# average. Builds crisp in release ($CARGO_TARGET_DIR honoured) unless $CRISP_BIN is set;
# crisp-grpcgo from $CRISP_GRPCGO_BIN or hack/build-grpcgo.sh. Needs: bpftrace (Debian's, 0.17),
# tracefs mounted at /sys/kernel/tracing (mounted here if it is not), protoc, jq, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5
turns=1000
warmup=50
pods=3
crictl_runs=20
crictl_bin=""
sockdump=""
keep=""
tap_flags="--json --full --all"
while (($#)); do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --turns) turns="$2"; shift 2 ;;
    --pods) pods="$2"; shift 2 ;;
    --crictl) crictl_bin="$2"; shift 2 ;;
    --crictl-runs) crictl_runs="$2"; shift 2 ;;
    --sockdump) sockdump="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    --tap) tap_flags="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "hack/observers.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done

die() {
  echo "hack/observers.sh: $*" >&2
  exit 1
}
[[ "$(id -u)" -eq 0 ]] || die "must run as root (containerd, bpftrace)"
# bpftrace is optional for the project (hack/setup.sh says so): installed here, on first use.
if ! command -v bpftrace >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bpftrace >/dev/null ||
    die "apt-get install bpftrace failed"
fi
for t in bpftrace protoc jq python3; do
  command -v "$t" >/dev/null || die "$t is missing (hack/setup.sh installs it)"
done
if [[ -z "$crictl_bin" ]]; then
  crictl_bin="$(command -v crictl || true)"
  [[ -n "$crictl_bin" ]] || crictl_bin=/var/tmp/cri-tools/bin/crictl
fi
if [[ ! -d /sys/kernel/tracing/events ]]; then
  mount -t tracefs nodev /sys/kernel/tracing || die "cannot mount tracefs on /sys/kernel/tracing"
fi

if [[ -z "${CRISP_BIN:-}" ]]; then
  nice -n 10 cargo build --release --locked -q -p crisp --bin crisp
  CRISP_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/crisp"
fi
grpcgo_src="${CRISP_GRPCGO_BIN:-$(bash hack/build-grpcgo.sh)}"

dir="$(mktemp -d /tmp/crisp-obs.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bash hack/containerd.sh stop "$dir/ctrd" >/dev/null 2>&1 || true
  if [[ -n "$keep" ]]; then
    mkdir -p "$keep"
    cp "$dir"/*.jsonl "$dir"/*.txt "$dir"/*.bt "$keep"/ 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

# A private copy of kubelet's client: the uprobes below attach to its inode only.
grpcgo="$dir/crisp-grpcgo"
cp "$grpcgo_src" "$grpcgo"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
read -r s0 t0 < <(steal)

bash hack/containerd.sh start "$dir/ctrd" --owner-pid $$ >/dev/null
ctrd="$dir/ctrd/containerd.sock"

start_crisp() { # name
  mkdir -p "$dir/$1"
  printf 'listen = "%s"\nupstream = "%s"\nstate_dir = "%s"\n[log]\nlevel = "warn"\n' \
    "$dir/$1/crisp.sock" "$ctrd" "$dir/$1/state" >"$dir/$1.toml"
  "$CRISP_BIN" --config "$dir/$1.toml" >"$dir/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [[ -S "$dir/$1/crisp.sock" ]] && return 0; sleep 0.1; done
  die "crisp $1 did not listen; its log: $(cat "$dir/$1.log")"
}
start_crisp plain
crisp_pid=${pids[-1]}
start_crisp tapped
tapped_pid=${pids[-1]}
read -ra tap_args <<<"$tap_flags"
"$CRISP_BIN" tap --admin-socket "$dir/tapped/admin.sock" "${tap_args[@]}" >"$dir/tap.jsonl" 2>"$dir/tap.log" &
pids+=($!)
tap_pid=$!
sleep 1
kill -0 "$tap_pid" 2>/dev/null || die "crisp tap exited: $(cat "$dir/tap.log")"

# Requests, encoded by protoc from the vendored CRI api.proto (Debian's protoc 3.21 does not know
# the debug_redact option: it is dropped from a copy).
sed 's/ \[debug_redact = true\]//' proto/k8s/cri-api/v1/api.proto >"$dir/api.proto"
enc() { protoc -I "$dir" --encode="runtime.v1.$1" api.proto | od -An -v -tx1 | tr -d ' \n'; }
unhex() { python3 -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(sys.stdin.read().strip()))'; }
dec() { unhex | protoc -I "$dir" --decode="runtime.v1.$1" api.proto; }
call() { # socket method hex → response hex
  local out
  out="$("$grpcgo" call --target "$1" --timeout 60s --method "/runtime.v1.RuntimeService/$2" --hex "$3" || true)"
  out="${out%%$'\n'*}"
  [[ "$(jq -r .code <<<"$out")" == OK ]] || die "$2 failed: $out"
  jq -r .response_hex <<<"$out"
}
mkdir -p "$dir/logs"
tapped="$dir/tapped/crisp.sock"
for p in $(seq "$pods"); do
  sandbox="metadata { name: \"obs-$p\" uid: \"obs-$p-uid\" namespace: \"default\" }
    log_directory: \"$dir/logs\"
    annotations { key: \"kubernetes.io/config.source\" value: \"api\" }
    linux { security_context { namespace_options { network: NODE } } }"
  pod="$(call "$tapped" RunPodSandbox "$(enc RunPodSandboxRequest <<<"config { $sandbox }")" |
    dec RunPodSandboxResponse | sed -n 's/^pod_sandbox_id: "\(.*\)"/\1/p')"
  for c in app sidecar; do
    ctr="$(call "$tapped" CreateContainer "$(enc CreateContainerRequest <<<"pod_sandbox_id: \"$pod\"
      config { metadata { name: \"$c\" } image { image: \"crisp.test/busybox:latest\" }
        command: \"sh\" command: \"-c\" command: \"sleep 3600\" log_path: \"$c.log\"
        envs { key: \"DB_PASSWORD\" value: \"hunter2-not-redacted\" }
        labels { key: \"io.kubernetes.container.name\" value: \"$c\" } }
      sandbox_config { $sandbox }")" |
      dec CreateContainerResponse | sed -n 's/^container_id: "\(.*\)"/\1/p')"
    call "$tapped" StartContainer "$(enc StartContainerRequest <<<"container_id: \"$ctr\"")" >/dev/null
  done
done
sleep 1
tap_setup_bytes=$(stat -c %s "$dir/tap.jsonl")

svc=/runtime.v1.RuntimeService
mix=(
  --method "$svc/Version" --hex "$(enc VersionRequest <<<'version: "0.1.0"')"
  --also "$svc/ListPodSandbox="
  --also "$svc/ListContainers="
  --also "$svc/PodSandboxStatus=$(enc PodSandboxStatusRequest <<<"pod_sandbox_id: \"$pod\"")"
  --also "$svc/ContainerStatus=$(enc ContainerStatusRequest <<<"container_id: \"$ctr\"")"
)
calls_per_turn=5

echo "hack/observers.sh: direct / crisp / crisp-tap, $runs runs of $turns turns" >&2
"$grpcgo" bench --lane "direct=$ctrd" --lane "crisp=$dir/plain/crisp.sock" --lane "crisp-tap=$tapped" \
  "${mix[@]}" --count "$turns" --warmup "$warmup" --runs "$runs" \
  --watch "crisp=$crisp_pid" --watch "crisp-tap=$tapped_pid" --watch "tap=$tap_pid" >"$dir/bench.jsonl"
sleep 1
tap_bytes=$(($(stat -c %s "$dir/tap.jsonl") - tap_setup_bytes))
tap_calls=$((runs * (turns + warmup) * calls_per_turn))

# The uprobes: method at Invoke's entry, the end of the call at clientStream.finish (its err
# argument, an interface, is nil — BX zero — on success), matched by goroutine (R14 under Go's
# register ABI; a goroutine may move to another thread while it waits).
cat >"$dir/uprobe.bt" <<EOF
uprobe:$grpcgo:"google.golang.org/grpc.(*ClientConn).Invoke" {
  @t[reg("r14")] = nsecs; @m[reg("r14")] = str(reg("di"), reg("si"));
}
uprobe:$grpcgo:"google.golang.org/grpc.(*clientStream).finish" /@t[reg("r14")]/ {
  printf("%s %d us %s\n", @m[reg("r14")], (nsecs - @t[reg("r14")]) / 1000, reg("bx") ? "error" : "ok");
  delete(@t[reg("r14")]); delete(@m[reg("r14")]);
}
EOF
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
: >"$dir/uprobe.txt"
: >"$dir/uprobe-runs.jsonl"
for r in $(seq "$runs"); do
  order=(off on)
  ((r % 2)) || order=(on off)
  for mode in "${order[@]}"; do
    bt=""
    if [[ $mode == on ]]; then
      bpftrace "$dir/uprobe.bt" >>"$dir/uprobe.txt" 2>"$dir/bpftrace.log" &
      bt=$!
      pids+=("$bt")
      for _ in $(seq 300); do grep -qs Attaching "$dir/uprobe.txt" "$dir/bpftrace.log" && break; sleep 0.1; done
      sleep 1
      bt0=$(ticks "$bt")
    fi
    TIMEFORMAT='%U %S'
    { time "$grpcgo" bench --lane "direct=$ctrd" "${mix[@]}" --count "$turns" --warmup "$warmup" \
      --runs 1 >"$dir/one.json" 2>"$dir/bench.err"; } 2>"$dir/time.txt"
    client_cpu=$(awk 'END {print $1 + $2}' "$dir/time.txt")
    btcpu=0
    if [[ -n $bt ]]; then
      btcpu=$(($(ticks "$bt") - bt0))
      kill -INT "$bt"
      wait "$bt" || true
    fi
    jq -c --arg mode "$mode" --argjson round "$r" --argjson client "$client_cpu" \
      --argjson bt_ticks "$btcpu" '. + {mode: $mode, round: $round, client_cpu_s: $client, bpftrace_ticks: $bt_ticks}' \
      "$dir/one.json" >>"$dir/uprobe-runs.jsonl"
  done
done
grep -qs Attaching "$dir/uprobe.txt" "$dir/bpftrace.log" || die "bpftrace did not attach: $(cat "$dir/bpftrace.log")"
uprobe_bytes=$(grep " us " "$dir/uprobe.txt" | wc -c)

# crictl: only its own calls. Plain and --debug, interleaved.
: >"$dir/crictl.txt"
if [[ -x "$crictl_bin" ]]; then
  for _ in $(seq "$crictl_runs"); do
    for dbg in plain debug; do
      flags=(--runtime-endpoint "unix://$ctrd" --image-endpoint "unix://$ctrd")
      [[ $dbg == debug ]] && flags+=(--debug)
      t_start=$(date +%s%N)
      "$crictl_bin" "${flags[@]}" ps >"$dir/crictl.out" 2>&1
      t_end=$(date +%s%N)
      echo "$dbg $(((t_end - t_start) / 1000)) $(stat -c %s "$dir/crictl.out")" >>"$dir/crictl.txt"
    done
  done
  "$crictl_bin" --runtime-endpoint "unix://$ctrd" --debug ps >"$dir/crictl-debug-sample.txt" 2>&1
fi

# sockdump: eBPF kprobes on the kernel's unix socket send path.
kprobe_error="$(timeout 20 bpftrace -e 'kprobe:unix_stream_sendmsg { @n = count(); exit(); }' 2>&1 |
  grep -v RLIMIT_MEMLOCK | grep -iE 'error|No such' | head -2 | tr '\n' ' ' || true)"
sockdump_error=""
if [[ -n "$sockdump" ]]; then
  sockdump_error="$(timeout 60 /usr/bin/python3 "$sockdump" --format hex "$ctrd" 2>&1 |
    grep -iE 'error|unable|exception|No such' | head -3 | tr '\n' ' ' || true)"
fi

read -r s1 t1 < <(steal)
stolen=$((t1 > t0 ? 100 * (s1 - s0) / (t1 - t0) : 0))
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- hack src e2e || echo ' (uncommitted changes)')"

DIR="$dir" RUNS="$runs" TURNS="$turns" WARMUP="$warmup" PODS="$pods" CALLS_PER_TURN="$calls_per_turn" \
  TAP_BYTES="$tap_bytes" TAP_CALLS="$tap_calls" UPROBE_BYTES="$uprobe_bytes" \
  KPROBE_ERROR="$kprobe_error" SOCKDUMP_ERROR="$sockdump_error" CRICTL="$crictl_bin" \
  CRICTL_RUNS="$crictl_runs" COMMIT="$commit" LOAD_BEFORE="$load_before" LOAD_AFTER="$load_after" \
  STOLEN="$stolen" CRISP_BIN="$CRISP_BIN" TAP_FLAGS="$tap_flags" \
  python3 - <<'PY'
import json, os, statistics as st
from datetime import datetime, timezone

env = os.environ
d = env["DIR"]
runs, turns, warmup = int(env["RUNS"]), int(env["TURNS"]), int(env["WARMUP"])
cpt = int(env["CALLS_PER_TURN"])
bench = [json.loads(l) for l in open(f"{d}/bench.jsonl")]
up = [json.loads(l) for l in open(f"{d}/uprobe-runs.jsonl")]
methods = list(bench[0]["methods"].keys())
short = {m: m.rsplit("/", 1)[1] for m in methods}
med = st.median
measured = turns * cpt  # measured calls per lane and run

def added(run_lane, run_base, q):
    """Mean over the mix's methods of (lane − base) for quantile q, in µs."""
    return st.mean(run_lane[m][q] - run_base[m][q] for m in methods)

rows = []
def lane_row(name, lane):
    a50 = [added({m: r["methods"][m][lane] for m in methods}, {m: r["methods"][m]["direct"] for m in methods}, "p50_us") for r in bench]
    a99 = [added({m: r["methods"][m][lane] for m in methods}, {m: r["methods"][m]["direct"] for m in methods}, "p99_us") for r in bench]
    return a50, a99

def fmt(v, digits=1):
    return f"{min(v):.{digits}f} / **{med(v):.{digits}f}** / {max(v):.{digits}f}"

def ms_per_1000(ticks):
    return [t * 10.0 / measured * 1000 for t in ticks]

out = []
p = out.append
p(f"Produced by `sudo hack/observers.sh --runs {runs} --turns {turns} --pods {env['PODS']} --tap \"{env['TAP_FLAGS']}\"` on "
  f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, crisp {env['COMMIT']}, "
  f"{os.cpu_count()} cores, load average {env['LOAD_BEFORE']} before and {env['LOAD_AFTER']} after, "
  f"{env['STOLEN']} % of the CPU time stolen by the host.")
p("")
p(f"Workload: kubelet's client library (grpc-go 1.33, `crisp-grpcgo bench`) against a private "
  f"containerd 1.6 running {env['PODS']} pods of 2 containers; a turn is "
  + ", ".join(short[m] for m in methods)
  + f"; {runs} runs of {turns} measured turns ({measured} calls) per configuration after {warmup} warm-up turns. "
  "Figures are min / **median** / max over the runs; added latency is the mean over the five methods "
  "of the configuration's p50 (p99) minus direct's, per run.")
p("")
p("| configuration | added p50 µs/call | added p99 µs/call | observer CPU, ms per 1,000 calls | bytes written per call | how measured |")
p("|---|---|---|---|---|---|")
base50 = [med([r["methods"][m]["direct"]["p50_us"] for m in methods]) for r in bench]
p(f"| direct (nothing observing) | — | — | — | 0 | lane of one bench, call by call |")
a50, a99 = lane_row("crisp", "crisp")
crisp_cpu = ms_per_1000([r["watch"]["crisp"]["cpu_ticks"] for r in bench])
p(f"| crisp, no tap | {fmt(a50)} | {fmt(a99)} | crisp: {fmt(crisp_cpu, 0)} | 0 | same bench |")
a50, a99 = lane_row("crisp-tap", "crisp-tap")
tcpu = ms_per_1000([r["watch"]["crisp-tap"]["cpu_ticks"] for r in bench])
tapcpu = ms_per_1000([r["watch"]["tap"]["cpu_ticks"] for r in bench])
tap_bpc = int(env["TAP_BYTES"]) / int(env["TAP_CALLS"])
p(f"| crisp + `crisp tap {env['TAP_FLAGS']}` to a file | {fmt(a50)} | {fmt(a99)} | crisp: {fmt(tcpu, 0)}; tap: {fmt(tapcpu, 0)} | {tap_bpc:,.0f} | same bench |")
# uprobe: paired rounds, one bench process each.
pairs = {}
for r in up:
    pairs.setdefault(r["round"], {})[r["mode"]] = r
u50, u99, ucli, ubt = [], [], [], []
for rnd, pr in sorted(pairs.items()):
    on, off = pr["on"], pr["off"]
    onm = {m: on["methods"][m]["direct"] for m in methods}
    offm = {m: off["methods"][m]["direct"] for m in methods}
    u50.append(added(onm, offm, "p50_us"))
    u99.append(added(onm, offm, "p99_us"))
    calls_total = (turns + warmup) * cpt
    ucli.append((on["client_cpu_s"] - off["client_cpu_s"]) / calls_total * 1e6)
    ubt.append(on["bpftrace_ticks"] * 10.0 / calls_total * 1000)
ub = int(env["UPROBE_BYTES"] or 0) / (runs * (turns + warmup) * cpt)
p(f"| direct + bpftrace uprobes on the client's grpc-go (Inspektor Gadget's mechanism) | {fmt(u50)} | {fmt(u99)} | bpftrace: {fmt(ubt, 0)}; the client's own (the probes run in it): {fmt(ucli, 0)} more | {ub:.0f} | one bench process with, one without, {runs} rounds alternating |")
p("| kubelet `-v=10` | measured in the lane (lead) | | | | |")
# crictl
if os.path.exists(f"{d}/crictl.txt") and os.path.getsize(f"{d}/crictl.txt") > 0:
    rows = [l.split() for l in open(f"{d}/crictl.txt")]
    def col(kind, i):
        return [int(r[i]) for r in rows if r[0] == kind]
    pw, dw = col("plain", 1), col("debug", 1)
    pb, db = col("plain", 2), col("debug", 2)
    p(f"| `crictl ps` vs `crictl --debug ps` ({env['CRICTL_RUNS']} each, interleaved) | wall {med(pw)/1000:.1f} ms vs {med(dw)/1000:.1f} ms (median) | | its own process, not kubelet's | {med(pb):.0f} vs {med(db):.0f} bytes per command | not an observer of kubelet: it sees only its own calls |")
else:
    p(f"| crictl --debug | not run: no crictl at {env['CRICTL']} | | | | |")
ke = env["KPROBE_ERROR"].strip() or "none (kprobes attach here)"
se = env["SOCKDUMP_ERROR"].strip()
p(f"| sockdump (kprobes on unix_stream_sendmsg) | cannot run here: bpftrace's `kprobe:unix_stream_sendmsg`: `{ke}`" + (f"; sockdump.py: `{se}`" if se else "") + " | | | | |")
p("")
p("Per method (median over runs, µs):")
p("")
p("| method | direct p50 | crisp added p50 | crisp-tap added p50 | uprobe added p50 | direct p99 | crisp added p99 | crisp-tap added p99 | uprobe added p99 |")
p("|---|---|---|---|---|---|---|---|---|")
for m in methods:
    def lane_added(lane, q):
        return med([r["methods"][m][lane][q] - r["methods"][m]["direct"][q] for r in bench])
    def up_added(q):
        return med([pr["on"]["methods"][m]["direct"][q] - pr["off"]["methods"][m]["direct"][q] for pr in pairs.values()])
    dp50 = med([r["methods"][m]["direct"]["p50_us"] for r in bench])
    dp99 = med([r["methods"][m]["direct"]["p99_us"] for r in bench])
    p(f"| {short[m]} | {dp50:.1f} | {lane_added('crisp','p50_us'):.1f} | {lane_added('crisp-tap','p50_us'):.1f} | {up_added('p50_us'):.1f} | {dp99:.1f} | {lane_added('crisp','p99_us'):.1f} | {lane_added('crisp-tap','p99_us'):.1f} | {up_added('p99_us'):.1f} |")
p("")
# What each shows: one line each.
def first(path, pred):
    try:
        for l in open(path):
            if pred(l):
                return l.rstrip("\n")
    except OSError:
        pass
    return ""
p("What they wrote (first of each kind):")
p("")
cs = first(f"{d}/tap.jsonl", lambda l: "ContainerStatus" in l)
cc = first(f"{d}/tap.jsonl", lambda l: "CreateContainer" in l)
p(f"- tap, ContainerStatus ({len(cs)} bytes): `{cs[:400]}…`")
i = cc.find("DB_PASSWORD")
p(f"- tap, CreateContainer ({len(cc)} bytes), around the secret env: `…{cc[max(0, i-40):i+120]}…`")
p(f"- bpftrace: `{first(f'{d}/uprobe.txt', lambda l: ' us ' in l)}`")
dbg = first(f"{d}/crictl-debug-sample.txt", lambda l: "ListContainersResponse" in l or "Response" in l)
p(f"- crictl --debug ps (a response line, {len(dbg)} bytes): `{dbg[:300]}…`")
p(f"- the tap's recording holds the secret in clear: {'yes' if 'hunter2-not-redacted' in open(f'{d}/tap.jsonl').read() else 'no'}")
print("\n".join(out))
PY
