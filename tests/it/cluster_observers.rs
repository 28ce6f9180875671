//! kubelet's own CRI log beside crisp's tap, on one workload (issue #46: "what each shows and
//! costs, measured on the same workload"; docs/TAP.md "Beside the other ways to see CRI
//! traffic"). The cluster lane of cluster_kubelets.rs with a kubelet of `CRISP_KUBE_VERSION`, the
//! same pods (the six shapes, each created, run until Ready and deleted) four times:
//!
//! 1. direct, kubelet at `--v=2` (a node's usual verbosity): the baseline;
//! 2. direct, kubelet at `--v=10`, where its CRI client (`k8s.io/cri-client`) logs each call
//!    (`[RemoteRuntimeService] ...`, requests and responses as Go structs);
//! 3. through crisp, no tap;
//! 4. through crisp with `crisp tap --json --full --all` attached, writing to a file.
//!
//! crisp (in the node) and the tap (on the host) are `CRISP_LANE_CRISP_BIN`, a release build in
//! the lane (a debug build's CPU would say nothing of crisp's).
//!
//! Per phase: kubelet's CPU time (utime + stime of its process), the bytes kubelet wrote to the
//! journal (rate limiting off for kubelet.service, so nothing is dropped), crisp's CPU time, the
//! tap's CPU time and bytes, and the CRI calls the tap counted. Printed as `observers|` rows;
//! asserted: kubelet's `--v=10` log has its CRI lines and `--v=2` none, and the tap shows every
//! pod's CreateContainer by pod name.
//!
//!   CRISP_KUBE_VERSION=1.36 CRISP_KUBE_BIN_DIR=DIR cargo test -p crisp --test it -- \
//!     cluster_observers:: --ignored --nocapture --test-threads 1     (hack/lanes.sh observers-1.36)

use std::path::Path;
use std::time::Instant;

use crate::cluster_kubelets::{
    crisp_kill, crisp_start, crisp_with_tap, journal_since, kubelet_config, kubelet_on, minor,
    node_now, run_shape, shapes, Runtime,
};
use crate::cluster_rollout::{join_with, kube_bin_dir, secs, BridgeGuard, Cluster};
use crate::node_support::*;

const CONTAINERD: &str = "/run/containerd/containerd.sock";
const CRISP: &str = "/run/crisp/crisp.sock";

/// utime + stime of a process, in seconds (clock ticks of 1/100 s, as Linux reports them).
pub(crate) fn cpu_secs(stat: &str) -> f64 {
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// A unit's main process's CPU seconds, read inside the node.
pub(crate) fn unit_cpu(node: &Node, unit: &str) -> f64 {
    let pid = node.prop(unit, "MainPID");
    cpu_secs(&node.nsenter(&["cat", &format!("/proc/{pid}/stat")]).stdout)
}

/// kubelet at verbosity `v` on `endpoint` (its journal unthrottled, so a chatty kubelet's lines
/// are all counted).
fn kubelet_at(cluster: &Cluster, node: &Node, v: u32, endpoint: &str) {
    node.put(
        "/etc/default/kubelet",
        format!("KUBELET_EXTRA_ARGS=--v={v}\n").as_bytes(),
        0o644,
    );
    let o = node.nsenter(&["systemctl", "daemon-reload"]);
    assert!(o.ok(), "{}", o.all());
    kubelet_on(cluster, node, endpoint);
}

/// One phase's numbers.
#[derive(Debug, Default)]
struct Cost {
    secs: f64,
    kubelet_cpu: f64,
    journal_bytes: usize,
    cri_lines: usize,
    crisp_cpu: f64,
    tap_cpu: f64,
    tap_bytes: u64,
}

/// Runs the shapes once and measures what kubelet (and crisp and its tap, when `crisp`) spent.
fn phase(
    cluster: &Cluster,
    node: &Node,
    rt: &Runtime,
    crisp: bool,
    tap: Option<&crate::cluster_kubelets::Tap>,
) -> (Cost, String) {
    let since = node_now(node);
    let k0 = unit_cpu(node, "kubelet.service");
    let c0 = if crisp {
        unit_cpu(node, "crisp-lane.service")
    } else {
        0.0
    };
    let (t0, b0) = tap.map_or((0.0, 0), |t| (t.cpu_secs(), t.bytes()));
    let t = Instant::now();
    for s in shapes(minor()) {
        let _ = run_shape(cluster, rt, &s);
    }
    let journal = journal_since(node, "kubelet", &since);
    let cost = Cost {
        secs: t.elapsed().as_secs_f64(),
        kubelet_cpu: unit_cpu(node, "kubelet.service") - k0,
        journal_bytes: journal.len(),
        cri_lines: journal.matches("[RemoteRuntimeService]").count(),
        crisp_cpu: if crisp {
            unit_cpu(node, "crisp-lane.service") - c0
        } else {
            0.0
        },
        tap_cpu: tap.map_or(0.0, |t| t.cpu_secs() - t0),
        tap_bytes: tap.map_or(0, |t| t.bytes() - b0),
    };
    (cost, journal)
}

#[test]
#[ignore = "needs Kubernetes binaries: CRISP_KUBE_VERSION=1.36 CRISP_KUBE_BIN_DIR=... (hack/lanes.sh observers-1.36)"]
fn kubelets_own_cri_log_beside_the_tap_on_one_workload() {
    let minor = minor();
    let bins = kube_bin_dir();
    let _bridge = BridgeGuard;
    let cluster = Cluster::up(&bins);
    let (node, joined) = join_with(&cluster, &bins, &kubelet_config(minor));
    eprintln!(
        "kubelet joined, node Ready in {}: {}",
        secs(joined),
        cluster.versions()
    );
    node.put(
        "/etc/systemd/system/kubelet.service.d/99-lane-journal.conf",
        b"[Service]\nLogRateLimitIntervalSec=0\n",
        0o644,
    );
    let rt = Runtime::new(&node);
    let work = tempfile::Builder::new()
        .prefix("cluster-observers")
        .tempdir_in(Path::new(REPO).join("target"))
        .unwrap();

    kubelet_at(&cluster, &node, 2, CONTAINERD);
    let (v2, j2) = phase(&cluster, &node, &rt, false, None);
    kubelet_at(&cluster, &node, 10, CONTAINERD);
    let (v10, j10) = phase(&cluster, &node, &rt, false, None);

    node.put_crisp();
    crisp_start(&node, CONTAINERD);
    kubelet_at(&cluster, &node, 2, CRISP);
    let (bare, _) = phase(&cluster, &node, &rt, true, None);
    crisp_kill(&node);
    let tap = crisp_with_tap(&node, &rt, CONTAINERD, work.path());
    kubelet_on(&cluster, &node, CRISP);
    let lines_before = tap.lines().len();
    let (tapped, _) = phase(&cluster, &node, &rt, true, Some(&tap));
    let lines = tap.lines();
    let calls = lines[lines_before..]
        .iter()
        .filter(|l| l["method"].is_string() && l["event"].is_null())
        .count();

    for (name, c) in [
        ("direct, kubelet --v=2", &v2),
        ("direct, kubelet --v=10", &v10),
        ("crisp, no tap, --v=2", &bare),
        ("crisp + tap --full --all, --v=2", &tapped),
    ] {
        eprintln!(
            "observers| 1.{minor} {name:32} {:6.1} s; kubelet CPU {:6.2} s, journal {:9} B ({} CRI lines); crisp CPU {:5.2} s; tap CPU {:5.2} s, {:9} B",
            c.secs,
            c.kubelet_cpu,
            c.journal_bytes,
            c.cri_lines,
            c.crisp_cpu,
            c.tap_cpu,
            c.tap_bytes
        );
    }
    // Per call of the workload (the calls the tap counted in its phase; the four phases run the
    // same pods): what kubelet's --v=10 adds to kubelet, and what the tap adds to crisp.
    let per = |x: f64| x / calls.max(1) as f64;
    eprintln!(
        "observers| 1.{minor}: {calls} CRI calls a phase; per call, kubelet --v=10 wrote {:.0} B more to the journal than --v=2 and spent {:.0} µs more CPU; the tap wrote {:.0} B, cost crisp {:.0} µs more CPU than no tap, and its own process {:.0} µs (crisp's CPU over the phase, probes and holds included: {:.2} s without the tap, {:.2} s with it)",
        per(v10.journal_bytes as f64 - v2.journal_bytes as f64),
        per((v10.kubelet_cpu - v2.kubelet_cpu) * 1e6),
        per(tapped.tap_bytes as f64),
        per((tapped.crisp_cpu - bare.crisp_cpu) * 1e6),
        per(tapped.tap_cpu * 1e6),
        bare.crisp_cpu,
        tapped.crisp_cpu,
    );
    // What kubelet --v=10 says of a CreateContainer and a RunPodSandbox (cut).
    for what in [
        "] CreateContainer\"",
        "] RunPodSandbox\"",
        "] ListContainers Response\"",
    ] {
        if let Some(l) = j10.lines().find(|l| l.contains(what)) {
            eprintln!(
                "observers| kubelet --v=10 line: {}",
                l.chars().take(360).collect::<String>()
            );
        }
    }

    assert_eq!(
        j2.matches("[RemoteRuntimeService]").count(),
        0,
        "--v=2 logs CRI calls?"
    );
    assert!(
        v10.cri_lines > 0,
        "kubelet --v=10 logged no CRI call ({} journal bytes)",
        v10.journal_bytes
    );
    for s in shapes(minor) {
        assert!(
            lines[lines_before..]
                .iter()
                .any(|l| l["method"] == "CreateContainer" && l["pod_name"] == s.name),
            "the tap shows no CreateContainer of {}",
            s.name
        );
    }
    drop(tap);
    crisp_kill(&node);
}

#[test]
fn cpu_seconds_are_read_after_the_command_name() {
    // A command name with spaces and a parenthesis does not shift the fields.
    let stat = "42 (kube let) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 12 0";
    assert!((cpu_secs(stat) - 3.8).abs() < 1e-9, "{}", cpu_secs(stat));
    assert_eq!(cpu_secs(""), 0.0);
}
