//! The newer-runtime lane (issue #34): the cluster lane of tests/it/cluster_kubelets.rs (a real
//! control plane from hack/cluster.sh, the nspawn systemd node) with a kubelet 1.33 or newer on
//! containerd 2.x instead of Debian's 1.6.20: the node binds the containerd named by
//! `CRISP_LANE_CONTAINERD_BIN` (hack/containerd-versions.sh builds it) over its own
//! (tests/it/support/node.rs). The API server and kubelet run with the ImageVolume gate on.
//!
//! `kubelet_on_containerd_2_through_crisp`, first with kubelet on containerd's socket (direct),
//! then on crisp's, each phase doing the same:
//! - NRI: containerd 2.x has it on; its plugin is loaded (`ctr plugins ls`) and its socket is
//!   there.
//! - RuntimeConfig: containerd 2.x implements it; kubelet's journal names the cgroup driver it
//!   took from the runtime, the same direct and through crisp, and through crisp the tap shows
//!   the call answered OK with containerd's answer (crisp never answers it itself).
//! - (a) the native, Istio-, Linkerd-, Vault-shaped and mixed pods of cluster_kubelets, with the
//!   gaps from containerd's own timestamps (sidecar started → app created, app finished →
//!   sidecar finished); through crisp the legacy ones ordered.
//! - (b) in-place resize (`kubectl patch --subresource resize`, InPlacePodVerticalScaling, on by
//!   default from 1.33): the container's CPU limit goes 200m → 400m without a restart; the
//!   container's quota in containerd's ContainerStatus follows; through crisp the tap shows
//!   kubelet's UpdatePodSandboxResources and UpdateContainerResources answered OK by containerd.
//! - (c) an image volume (`volumes[].image`, containerd 2.1+): the pod's container sees the
//!   image's files at its mount; through crisp its CreateContainer carries `Mount.image` (tap).
//!
//! `kubelet_on_crio_through_crisp`: the same node joined on containerd, then CRI-O installed in it
//! (`CRISP_LANE_CRIO_BIN`, hack/crio-binaries.sh; Debian's conmon from this host) and kubelet
//! moved onto CRI-O's socket: the five pods direct and through crisp, the legacy ones ordered,
//! and RuntimeConfig answered by CRI-O with kubelet's driver the same both ways; issue #45's rows
//! (`cluster_newer_pods.rs`: a restart rule, a pod restarted in place, bytes in env, and with
//! 1.36 the streamed lists CRI-O serves); then, through crisp, the rest of the newer-kubelet
//! lanes' table (cluster_kubelets.rs): a Job with a legacy sidecar completes, kubelet's span of a
//! held CreateContainer and crisp's hold span in one trace, crisp SIGKILLed mid-hold.
//!
//! Needs the binaries, so ignored by default; hack/lanes.sh runs them (lanes
//! kubelet-1.34-containerd2, kubelet-1.34-crio, kubelet-1.35-crio, kubelet-1.36-crio):
//!   CRISP_KUBE_VERSION=1.34 CRISP_KUBE_BIN_DIR=DIR CRISP_LANE_CONTAINERD_BIN=OUT/bin/containerd \
//!     cargo test -p crisp --test it -- cluster_runtimes:: --ignored --nocapture --test-threads 1

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster_kubelets::{
    crisp_config, crisp_kill, crisp_with_tap, held_in_kubelets_trace, in_node, job_completes,
    journal_since, kubelet_config, kubelet_on, node_now, restart_mid_hold, run_shape, shapes,
    stop_order, verdict, Gaps, Runtime, Spans, Tap, READY_AFTER,
};
use crate::cluster_rollout::{join_with, kube_bin_dir, secs, BridgeGuard, Cluster};
use crate::node_support::*;
use k8s_cri::v1 as cri;

/// The kubelet minor under test: CRISP_KUBE_VERSION ("1.34"), 1.33 or newer (resize on by
/// default, UpdatePodSandboxResources sent).
fn minor() -> u32 {
    let v = std::env::var("CRISP_KUBE_VERSION")
        .expect("CRISP_KUBE_VERSION: the kubelet minor under test, e.g. 1.34");
    let m = v
        .strip_prefix("1.")
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("CRISP_KUBE_VERSION={v}: expected 1.<minor>"));
    assert!(m >= 33, "CRISP_KUBE_VERSION={v}: this lane needs kubelet 1.33 or newer (in-place resize on by default)");
    m
}

/// The lane's kubelet config: cluster_kubelets' (cgroup driver from CRI, tracing) with the
/// ImageVolume gate on.
fn config(minor: u32) -> String {
    let c = kubelet_config(minor);
    if c.contains("featureGates:\n") {
        c.replace("featureGates:\n", "featureGates:\n  ImageVolume: true\n")
    } else {
        format!("{c}featureGates:\n  ImageVolume: true\n")
    }
}

/// kubelet's journal line when it takes the cgroup driver from the runtime's RuntimeConfig
/// (1.30–1.34: `Using cgroup driver setting received from the CRI runtime` cgroupDriver="..."):
/// the driver it names, or None when it fell back to its own flag (or has not asked).
fn driver_from_cri(journal: &str) -> Option<String> {
    journal
        .lines()
        .rev()
        .filter(|l| l.contains("received from the CRI runtime"))
        .filter_map(|l| l.split("cgroupDriver=").nth(1))
        .map(|d| d.trim().trim_matches('"').to_string())
        .next()
}

// --- (b) in-place resize -----------------------------------------------------------------------

/// What one resize showed.
#[derive(Debug)]
struct Resize {
    /// containerd's CPU quota of the container before and after.
    quota: (i64, i64),
    /// From the patch until containerd reports the new quota.
    took: Duration,
    /// The container's id is the same after (resized in place, not recreated).
    same_container: bool,
    restarts: String,
    /// kubelet's status of the container's CPU limit after.
    status_limit: String,
    sandbox: String,
    container: String,
}

const RESIZE_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: resize\n  namespace: default\nspec:\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: crisp.test/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"exec sleep 3600\"]\n    resizePolicy:\n    - resourceName: cpu\n      restartPolicy: NotRequired\n    resources:\n      requests:\n        cpu: 100m\n        memory: 32Mi\n      limits:\n        cpu: 200m\n        memory: 64Mi\n";

/// CFS quota of a 400m limit at the default 100 ms period.
const QUOTA_400M: i64 = 40_000;

impl Resize {
    /// The lane's log line of this resize (`lane`: `direct`, `crisp `).
    fn log(&self, minor: u32, lane: &str) {
        eprintln!(
            "resize| 1.{minor}+containerd2 {lane}: CPU limit 200m→400m, containerd's quota {}→{} in {} ms, same container {}, restartCount {}, status limit {}",
            self.quota.0,
            self.quota.1,
            self.took.as_millis(),
            self.same_container,
            self.restarts,
            self.status_limit
        );
    }
}

/// The tap's lines of `method` calls whose `field` is `id`.
fn calls_of<'a>(
    lines: &'a [serde_json::Value],
    method: &str,
    field: &str,
    id: &str,
) -> Vec<&'a serde_json::Value> {
    lines
        .iter()
        .filter(|l| l["method"] == method && l[field] == id)
        .collect()
}

fn resize(cluster: &Cluster, rt: &Runtime) -> Resize {
    cluster.apply(RESIZE_POD);
    cluster.wait("pod resize Ready", Duration::from_secs(180), || {
        cluster.pod_ready("default", "resize")
    });
    let (id, _) = rt.containers("resize")["app"].clone();
    let sandbox = rt.sandbox_id("resize");
    let before = rt.cpu_quota(&id);
    let t = Instant::now();
    let o = cluster.kubectl(&[
        "patch",
        "pod",
        "resize",
        "--subresource",
        "resize",
        // strategic: merges `containers` by name (a merge patch would replace the list)
        "--type",
        "strategic",
        "--patch",
        r#"{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"150m","memory":"32Mi"},"limits":{"cpu":"400m","memory":"64Mi"}}}]}}"#,
    ]);
    assert!(o.ok(), "kubectl patch --subresource resize: {}", o.all());
    while rt.cpu_quota(&id) != QUOTA_400M {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "containerd's CPU quota of the resized container is {} after 120 s, not {QUOTA_400M}; pod status: {}",
            rt.cpu_quota(&id),
            cluster.jsonpath(&["pod", "resize"], "{.status}")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = t.elapsed();
    let status_limit = {
        let t = Instant::now();
        loop {
            let l = cluster.jsonpath(
                &["pod", "resize"],
                "{.status.containerStatuses[0].resources.limits.cpu}",
            );
            if l == "400m" || t.elapsed() > Duration::from_secs(60) {
                break l;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let after = rt.containers("resize")["app"].0.clone();
    let restarts = cluster.jsonpath(
        &["pod", "resize"],
        "{.status.containerStatuses[0].restartCount}",
    );
    let _ = cluster.kubectl(&["delete", "pod", "resize", "--wait=true", "--timeout=60s"]);
    Resize {
        quota: (before, QUOTA_400M),
        took,
        same_container: after == id,
        restarts,
        status_limit,
        sandbox,
        container: id,
    }
}

// --- (c) image volumes -------------------------------------------------------------------------

const IMAGEVOL_POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: imagevol\n  namespace: default\nspec:\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: crisp.test/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"test -x /vol/bin/busybox || exit 3; exec sleep 3600\"]\n    readinessProbe:\n      exec:\n        command: [\"test\", \"-x\", \"/vol/bin/busybox\"]\n      periodSeconds: 1\n    volumeMounts:\n    - name: img\n      mountPath: /vol\n  volumes:\n  - name: img\n    image:\n      reference: crisp.test/busybox:latest\n      pullPolicy: IfNotPresent\n";

/// Starts the image-volume pod, waits until its container sees the image's busybox at /vol,
/// and returns (the time to Ready, restartCount). Panics if the API server dropped the volume
/// (its ImageVolume gate off).
fn image_volume(cluster: &Cluster) -> (Duration, String) {
    cluster.apply(IMAGEVOL_POD);
    let kept = cluster.jsonpath(&["pod", "imagevol"], "{.spec.volumes[0].image.reference}");
    assert_eq!(
        kept, "crisp.test/busybox:latest",
        "the API server dropped the image volume: is its ImageVolume gate on (CLUSTER_FEATURE_GATES)?"
    );
    let took = cluster.wait("pod imagevol Ready", Duration::from_secs(180), || {
        cluster.pod_ready("default", "imagevol")
    });
    let restarts = cluster.jsonpath(
        &["pod", "imagevol"],
        "{.status.containerStatuses[0].restartCount}",
    );
    let _ = cluster.kubectl(&["delete", "pod", "imagevol", "--wait=true", "--timeout=60s"]);
    (took, restarts)
}

/// Whether a decoded CreateContainer request holds a mount at `path` whose `image` names an
/// image (at any depth: the tap's JSON of `config.mounts[]`).
fn has_image_mount(v: &serde_json::Value, path: &str) -> bool {
    match v {
        serde_json::Value::Object(m) => {
            let here = m.get("container_path").and_then(|p| p.as_str()) == Some(path)
                && m.get("image")
                    .and_then(|i| i.get("image"))
                    .and_then(|i| i.as_str())
                    .is_some_and(|i| !i.is_empty());
            here || m.values().any(|x| has_image_mount(x, path))
        }
        serde_json::Value::Array(a) => a.iter().any(|x| has_image_mount(x, path)),
        _ => false,
    }
}

// --- the lane ---------------------------------------------------------------------------------

/// The RuntimeConfig lines of the tap, each asserted answered OK by the runtime (no hold, a
/// response relayed).
fn runtime_config_lines(tap: &Tap) -> Vec<serde_json::Value> {
    let rc: Vec<serde_json::Value> = tap
        .lines()
        .into_iter()
        .filter(|l| l["method"] == "RuntimeConfig")
        .collect();
    assert!(!rc.is_empty(), "no RuntimeConfig call through crisp");
    for l in &rc {
        assert!(
            l["code"] == 0 && l.get("hold").is_none() && l.get("response").is_some(),
            "RuntimeConfig not answered OK by the runtime through crisp: {l}"
        );
    }
    rc
}

/// One phase's shapes: their gaps, with the legacy ones' order checked when `via_crisp`.
fn run_shapes(
    cluster: &Cluster,
    rt: &Runtime,
    minor: u32,
    runtime: &str,
    via_crisp: bool,
) -> BTreeMap<&'static str, Gaps> {
    let mode = if via_crisp { "crisp " } else { "direct" };
    let mut out = BTreeMap::new();
    for s in shapes(minor) {
        let (g, t) = run_shape(cluster, rt, &s);
        eprintln!(
            "gaps| 1.{minor}+{runtime} {mode} {:8} sidecar {:13} started→app created {:8.0} ms, app finished→sidecar finished {:8.0} ms ({})",
            s.name, s.sidecar, g.create_ms, g.stop_ms, verdict(&s, &g)
        );
        eprintln!(
            "stops| 1.{minor}+{runtime} {mode} {:8} {}",
            s.name,
            stop_order(&t)
        );
        if via_crisp && s.ordered_create {
            assert!(
                g.create_ms >= READY_AFTER.as_millis() as f64 - 100.0,
                "{}: the app was created {:.0} ms after {} started, before it was ready ({READY_AFTER:?}): {t:?}",
                s.name,
                g.create_ms,
                s.sidecar
            );
        }
        if via_crisp && s.ordered_stop {
            assert!(
                g.stop_ms >= 0.0,
                "{}: {} finished {:.0} ms before the app: {t:?}",
                s.name,
                s.sidecar,
                -g.stop_ms
            );
        }
        out.insert(s.name, g);
    }
    out
}

#[test]
#[ignore = "needs Kubernetes 1.33+ and containerd 2.x binaries: CRISP_KUBE_VERSION=1.34 CRISP_KUBE_BIN_DIR=... CRISP_LANE_CONTAINERD_BIN=... cargo test --test it -- cluster_runtimes:: --ignored (hack/lanes.sh kubelet-1.34-containerd2)"]
fn kubelet_on_containerd_2_through_crisp() {
    let minor = minor();
    let containerd = lane_containerd().expect(
        "CRISP_LANE_CONTAINERD_BIN: a containerd 2.x binary (hack/containerd-versions.sh SRC v2.3.4 OUT)",
    );
    let bins = kube_bin_dir();
    // The API server keeps `volumes[].image` only with the gate on (beta, off by default in 1.34).
    std::env::set_var("CLUSTER_FEATURE_GATES", "ImageVolume=true");
    let _bridge = BridgeGuard;
    let cluster = Cluster::up(&bins);
    let (node, joined) = join_with(&cluster, &bins, &config(minor));
    let version = cluster.versions();
    assert!(
        version.starts_with(&format!("v1.{minor}.")) && version.contains(" containerd://2."),
        "kubelet {version}: not 1.{minor} on containerd 2.x ({})",
        containerd.display()
    );
    eprintln!("kubelet joined, node Ready in {}: {version}", secs(joined));

    // NRI: on by default in containerd 2.x, with nothing in the lane's config to turn it off.
    let plugins = node.must(&["ctr", "plugins", "ls"]).stdout;
    let nri = plugins
        .lines()
        .find(|l| l.starts_with("io.containerd.nri.v1"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    assert!(
        nri.ends_with(" ok"),
        "containerd's NRI plugin not loaded: {plugins}"
    );
    let nri_sock = node.exists("/var/run/nri/nri.sock");
    assert!(nri_sock, "no NRI socket /var/run/nri/nri.sock");
    eprintln!("nri| containerd's plugin `{nri}`, socket /var/run/nri/nri.sock present");

    let rt = Runtime::new(&node);
    let work = tempfile::Builder::new()
        .prefix("cluster-runtimes")
        .tempdir_in(Path::new(REPO).join("target"))
        .unwrap();

    // 1. Direct: kubelet on containerd.
    let direct_journal = node
        .nsenter(&["journalctl", "-u", "kubelet", "--no-pager"])
        .stdout;
    let direct_driver = driver_from_cri(&direct_journal);
    assert!(
        direct_driver.is_some(),
        "direct: kubelet did not take its cgroup driver from containerd 2.x's RuntimeConfig"
    );
    let direct = run_shapes(&cluster, &rt, minor, "containerd2", false);
    let direct_resize = resize(&cluster, &rt);
    direct_resize.log(minor, "direct");
    let (direct_vol, direct_vol_restarts) = image_volume(&cluster);
    eprintln!(
        "imagevol| 1.{minor}+containerd2 direct: pod with an image volume Ready in {}, restartCount {direct_vol_restarts}",
        secs(direct_vol)
    );

    // 2. Through crisp, its tap attached before kubelet's first call.
    let mut tap = crisp_with_tap(&node, &rt, "/run/containerd/containerd.sock", work.path());
    let since = node_now(&node);
    kubelet_on(&cluster, &node, "/run/crisp/crisp.sock");
    let journal = journal_since(&node, "kubelet", &since);
    let crisp_driver = driver_from_cri(&journal);
    let rc = runtime_config_lines(&tap);
    assert_eq!(
        crisp_driver, direct_driver,
        "kubelet's cgroup driver from the runtime differs through crisp"
    );
    eprintln!(
        "runtime-config| 1.{minor}+containerd2: {} RuntimeConfig call(s) in the tap, code {}, containerd's answer {}; kubelet's driver from the runtime: direct {:?}, through crisp {:?}",
        rc.len(),
        rc[0]["code"],
        rc[0]["response"],
        direct_driver,
        crisp_driver
    );

    let through = run_shapes(&cluster, &rt, minor, "containerd2", true);
    let native_holds = tap
        .lines()
        .into_iter()
        .filter(|l| l["pod_name"] == "native" && l.get("hold").is_some())
        .count();
    assert_eq!(native_holds, 0, "crisp held the native-sidecar pod");

    let crisp_resize = resize(&cluster, &rt);
    crisp_resize.log(minor, "crisp ");
    for r in [&direct_resize, &crisp_resize] {
        assert!(
            r.same_container && r.restarts == "0" && r.status_limit == "400m",
            "resize not in place: {r:?}"
        );
    }
    assert_eq!(direct_resize.quota, crisp_resize.quota);
    let lines = tap.lines();
    let sandbox_updates = calls_of(
        &lines,
        "UpdatePodSandboxResources",
        "pod_sandbox_id",
        &crisp_resize.sandbox,
    );
    let container_updates = calls_of(
        &lines,
        "UpdateContainerResources",
        "container_id",
        &crisp_resize.container,
    );
    assert!(
        !sandbox_updates.is_empty(),
        "no UpdatePodSandboxResources of the resized pod's sandbox through crisp"
    );
    assert!(
        !container_updates.is_empty(),
        "no UpdateContainerResources of the resized container through crisp"
    );
    for l in sandbox_updates.iter().chain(&container_updates) {
        assert!(
            l["code"] == 0 && l.get("hold").is_none(),
            "a resize call not answered OK by containerd through crisp: {l}"
        );
    }
    let failed_notify = journal_since(&node, "kubelet", &since)
        .lines()
        .filter(|l| l.contains("Failed to notify runtime for UpdatePodSandboxResources"))
        .count();
    assert_eq!(
        failed_notify, 0,
        "kubelet logged a failed UpdatePodSandboxResources"
    );
    eprintln!(
        "resize| 1.{minor}+containerd2 tap: {} UpdatePodSandboxResources (code {}, {} request bytes), {} UpdateContainerResources (code {}), answered by containerd in {:.1}/{:.1} ms",
        sandbox_updates.len(),
        sandbox_updates[0]["code"],
        sandbox_updates[0]["request_bytes"],
        container_updates.len(),
        container_updates[0]["code"],
        sandbox_updates[0]["duration_ms"].as_f64().unwrap_or(0.0),
        container_updates[0]["duration_ms"].as_f64().unwrap_or(0.0)
    );

    let (crisp_vol, crisp_vol_restarts) = image_volume(&cluster);
    assert_eq!(crisp_vol_restarts, direct_vol_restarts);
    let creates: Vec<serde_json::Value> = tap
        .lines()
        .into_iter()
        .filter(|l| l["method"] == "CreateContainer" && l["pod_name"] == "imagevol")
        .collect();
    assert!(
        creates
            .iter()
            .any(|l| l["code"] == 0 && has_image_mount(&l["request"], "/vol")),
        "no CreateContainer of the imagevol pod with its Mount.image through crisp: {creates:?}"
    );
    eprintln!(
        "imagevol| 1.{minor}+containerd2 crisp : pod with an image volume Ready in {} (direct {}), restartCount {crisp_vol_restarts}; its CreateContainer crossed with Mount.image (tap, code 0)",
        secs(crisp_vol),
        secs(direct_vol)
    );

    tap.detach();
    crisp_kill(&node);
    eprintln!(
        "summary| 1.{minor}+containerd2 ({version}): direct {:?} / through crisp {:?}",
        direct, through
    );
    let _ = std::io::stderr().flush();
    drop(node);
}

// --- CRI-O -------------------------------------------------------------------------------------

/// CRI-O's socket in the node.
const CRIO_SOCK: &str = "/run/crio/crio.sock";

/// CRI-O in the node: vfs storage (the node's root is an overlay), cgroupfs as kubelet, runc
/// through hack/crio-runc (no CAP_SYS_RESOURCE here), the lane's CNI network and pause image
/// (its entrypoint, `pause_command = ""`), NRI on. The unit starts it with
/// `--disable-hostport-mapping`: the node has neither iptables nor nft, and CRI-O refuses to
/// start without one otherwise ("can't create HostPortManager"); no pod of the lane maps a port.
const CRIO_CONF: &str = r#"[crio]
storage_driver = "vfs"
[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
pinns_path = "/usr/local/bin/pinns"
[crio.runtime.runtimes.runc]
runtime_path = "/usr/local/bin/crio-runc-node"
monitor_path = "/usr/bin/conmon"
[crio.image]
pause_image = "crisp.test/pause:latest"
pause_command = ""
[crio.network]
network_dir = "/etc/cni/net.d/"
plugin_dirs = ["/usr/lib/cni"]
[crio.nri]
enable_nri = true
"#;

const CRIO_UNIT: &str = "[Unit]\nDescription=CRI-O (the kubelet-1.34-crio lane)\nAfter=cgroup-rw.service network.target\n\n[Service]\nExecStart=/usr/local/bin/crio --config /etc/crio/crio.conf --disable-hostport-mapping\nRestart=on-failure\nDelegate=yes\nKillMode=process\nLimitNOFILE=1048576\n";

/// The CRI-O binary of the lane (`CRISP_LANE_CRIO_BIN`, `pinns` beside it).
fn lane_crio() -> std::path::PathBuf {
    let bin = std::path::PathBuf::from(std::env::var_os("CRISP_LANE_CRIO_BIN").expect(
        "CRISP_LANE_CRIO_BIN: a CRI-O binary with pinns beside it (hack/crio-binaries.sh SRC v1.34.11 OUT)",
    ));
    for p in [bin.clone(), bin.with_file_name("pinns")] {
        assert!(
            p.is_file(),
            "{} missing: hack/crio-binaries.sh SRC v1.34.11 OUT",
            p.display()
        );
    }
    bin
}

/// Installs CRI-O into the joined node (its binaries, Debian's conmon and the two libraries the
/// node's rootfs lacks, both from this host; the lane's images copied into its storage by
/// skopeo), starts it and moves kubelet onto it. Returns the time until kubelet is Ready on it.
fn node_on_crio(cluster: &Cluster, node: &Node, crio: &Path) -> Duration {
    let t = Instant::now();
    let host = |p: &str| std::fs::read(p).unwrap_or_else(|e| panic!("{p} on this host: {e}"));
    node.put("/usr/local/bin/crio", &std::fs::read(crio).unwrap(), 0o755);
    node.put(
        "/usr/local/bin/pinns",
        &std::fs::read(crio.with_file_name("pinns")).unwrap(),
        0o755,
    );
    node.put(
        "/usr/local/bin/crio-runc",
        &std::fs::read(Path::new(REPO).join("hack/crio-runc")).unwrap(),
        0o755,
    );
    // (and without the hugetlb limits runc cannot set in the node: hack/crio-runc)
    node.put(
        "/usr/local/bin/crio-runc-node",
        b"#!/bin/sh\nCRIO_RUNC_NO_HUGETLB=1 exec /usr/local/bin/crio-runc \"$@\"\n",
        0o755,
    );
    node.put("/usr/bin/conmon", &host("/usr/bin/conmon"), 0o755);
    for lib in ["libglib-2.0.so.0", "libsqlite3.so.0"] {
        node.put(
            &format!("/usr/lib/x86_64-linux-gnu/{lib}"),
            &host(&format!("/usr/lib/x86_64-linux-gnu/{lib}")),
            0o644,
        );
    }
    node.put("/etc/crio/crio.conf", CRIO_CONF.as_bytes(), 0o644);
    node.put(
        "/etc/containers/policy.json",
        br#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        0o644,
    );
    let store = format!(
        "vfs@{}+{}",
        in_node(node, "/var/lib/containers/storage").display(),
        in_node(node, "/run/containers/storage").display()
    );
    let images = Path::new(REPO).join("target/cluster-images");
    for i in ["pause", "busybox"] {
        let o = crate::cluster_rollout::run(
            std::process::Command::new("skopeo")
                .args(["--policy"])
                .arg(node.path("/etc/containers/policy.json"))
                .args(["copy", "-q"])
                .arg(format!(
                    "oci-archive:{}",
                    images.join(format!("{i}.tar")).display()
                ))
                .arg(format!("containers-storage:[{store}]crisp.test/{i}:latest")),
        );
        assert!(
            o.ok(),
            "skopeo copy {i} into the node's CRI-O storage: {}",
            o.all()
        );
    }
    node.put(
        "/etc/systemd/system/crio.service",
        CRIO_UNIT.as_bytes(),
        0o644,
    );
    let o = node.nsenter(&["systemctl", "daemon-reload"]);
    assert!(o.ok(), "{}", o.all());
    let o = node.nsenter(&["systemctl", "start", "crio.service"]);
    assert!(o.ok(), "start crio: {}", o.all());
    let sock = in_node(node, CRIO_SOCK);
    let up = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(
            up.elapsed() < Duration::from_secs(60),
            "CRI-O never listened: {}",
            node.journal("crio", 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // CRI-O answers on its socket (not just listens), and says how its start went.
    let version = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = crate::support::runtime_client(&sock).await;
            c.version(cri::VersionRequest::default()).await
        });
    let journal = node
        .nsenter(&["journalctl", "-u", "crio", "-n", "60", "--no-pager"])
        .stdout;
    assert!(
        version.is_ok(),
        "CRI-O's Version: {version:?}; its journal:\n{journal}"
    );
    eprintln!(
        "crio| {} up on {CRIO_SOCK}; its journal's warnings and errors:\n{}",
        version.unwrap().into_inner().runtime_version,
        journal
            .lines()
            .filter(|l| l.contains("level=warn")
                || l.contains("level=error")
                || l.contains("level=fatal"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // On failure, CRI-O's side of it too (kubelet_on shows kubelet's journal).
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        kubelet_on(cluster, node, CRIO_SOCK)
    })) {
        eprintln!(
            "crio| kubelet not Ready on CRI-O; crio.service {} (restarts {}), its journal:\n{}",
            node.prop("crio.service", "ActiveState"),
            node.prop("crio.service", "NRestarts"),
            node.journal("crio", 80)
        );
        std::panic::resume_unwind(e);
    }
    t.elapsed()
}

#[test]
#[ignore = "needs Kubernetes 1.33+ and CRI-O binaries: CRISP_KUBE_VERSION=1.34 CRISP_KUBE_BIN_DIR=... CRISP_LANE_CRIO_BIN=... cargo test --test it -- cluster_runtimes:: --ignored (hack/lanes.sh kubelet-1.34-crio)"]
fn kubelet_on_crio_through_crisp() {
    let minor = minor();
    let crio = lane_crio();
    let bins = kube_bin_dir();
    let _bridge = BridgeGuard;
    let spans = Spans::start();
    let cluster = Cluster::up(&bins);
    let (node, joined) = join_with(&cluster, &bins, &kubelet_config(minor));
    let since = node_now(&node);
    let moved = node_on_crio(&cluster, &node, &crio);
    // The node's status names the runtime from the new kubelet's first full status update on,
    // which may come a little after the heartbeat that made it Ready.
    let t = Instant::now();
    while !cluster.versions().contains(" cri-o://") && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let version = cluster.versions();
    assert!(
        version.starts_with(&format!("v1.{minor}.")) && version.contains(" cri-o://"),
        "kubelet {version}: not 1.{minor} on CRI-O ({})",
        crio.display()
    );
    eprintln!(
        "kubelet joined in {}, on CRI-O and Ready {} later: {version}",
        secs(joined),
        secs(moved)
    );
    let direct_driver = driver_from_cri(&journal_since(&node, "kubelet", &since));
    let rt = Runtime::at(&node, CRIO_SOCK);
    let work = tempfile::Builder::new()
        .prefix("cluster-runtimes-crio")
        .tempdir_in(Path::new(REPO).join("target"))
        .unwrap();
    let direct = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_shapes(&cluster, &rt, minor, "crio", false)
    })) {
        Ok(d) => d,
        Err(e) => {
            // What kept the pod from running: its events, CRI-O's and kubelet's last words.
            eprintln!(
                "crio| a pod did not run on CRI-O:\n{}\n--- crio\n{}\n--- kubelet\n{}",
                cluster
                    .kubectl(&["describe", "pods", "-n", "default"])
                    .stdout,
                node.journal("crio", 40),
                node.journal("kubelet", 40)
            );
            std::panic::resume_unwind(e);
        }
    };

    // Issue #45's rows (a restart rule from 1.35, a pod restarted in place and bytes in env
    // from 1.36), on CRI-O as on containerd.
    let direct_rows = crate::cluster_newer_pods::run(&cluster, &rt, minor, "direct", None);
    // crisp's hold spans go to the lane's receiver, beside kubelet's.
    node.put("/etc/crisp/config.toml", crisp_config().as_bytes(), 0o644);
    let mut tap = crisp_with_tap(&node, &rt, CRIO_SOCK, work.path());
    let since = node_now(&node);
    kubelet_on(&cluster, &node, "/run/crisp/crisp.sock");
    let crisp_driver = driver_from_cri(&journal_since(&node, "kubelet", &since));
    let rc = runtime_config_lines(&tap);
    assert_eq!(
        crisp_driver, direct_driver,
        "kubelet's cgroup driver from the runtime differs through crisp"
    );
    eprintln!(
        "runtime-config| 1.{minor}+crio: {} RuntimeConfig call(s) in the tap, code {}, CRI-O's answer {}; kubelet's driver from the runtime: direct {direct_driver:?}, through crisp {crisp_driver:?}",
        rc.len(),
        rc[0]["code"],
        rc[0]["response"]
    );
    let through = run_shapes(&cluster, &rt, minor, "crio", true);
    let native_holds = tap
        .lines()
        .into_iter()
        .filter(|l| l["pod_name"] == "native" && l.get("hold").is_some())
        .count();
    assert_eq!(native_holds, 0, "crisp held the native-sidecar pod");
    let rows = crate::cluster_newer_pods::run(&cluster, &rt, minor, "crisp", Some(&tap));
    if let (Some(d), Some(c)) = (direct_rows.rule_recreate_ms, rows.rule_recreate_ms) {
        eprintln!("rule| 1.{minor}+crio: app exit → re-created: direct {d:.0} ms, through crisp {c:.0} ms");
    }
    if let (Some(d), Some(c)) = (direct_rows.in_place_create_ms, rows.in_place_create_ms) {
        eprintln!("inplace| 1.{minor}+crio: second sidecar started → second app created: direct {d:.0} ms, through crisp {c:.0} ms");
    }
    if let (Some(d), Some(c)) = (&direct_rows.env_bytes, &rows.env_bytes) {
        assert_eq!(d, c, "the non-UTF-8 env value differs through crisp");
    }
    if minor >= 36 {
        streamed_lists_answered(&tap, minor);
    }
    // The rest of the newer-kubelet lanes' table, on CRI-O: a Job, one trace, crisp killed
    // mid-hold.
    let tag = format!("1.{minor}+crio");
    job_completes(&cluster, &tag);
    held_in_kubelets_trace(&cluster, &spans, &tag);
    restart_mid_hold(&cluster, &node, &rt, &mut tap, CRIO_SOCK, &tag);
    tap.detach();
    crisp_kill(&node);
    eprintln!(
        "summary| 1.{minor}+crio ({version}): direct {:?} / through crisp {:?}",
        direct, through
    );
    let _ = std::io::stderr().flush();
    drop(node);
}

/// Issue #45: kubelet 1.36 with `CRIListStreaming` (on in the lane's config from 1.36) lists
/// through KEP-5825's server-streaming calls, and CRI-O 1.36 serves them (containerd 1.6 and
/// 2.3 answer Unimplemented, and kubelet falls back): through crisp they come back OK, relayed
/// message by message. Prints each method's calls and codes.
fn streamed_lists_answered(tap: &Tap, minor: u32) {
    let lines = tap.lines();
    let stream = |l: &&serde_json::Value| {
        l["method"]
            .as_str()
            .is_some_and(|m| m.starts_with("Stream"))
    };
    // A streamed call's messages are lines of their own (`"event": "message"`), then the call's.
    let (messages, calls): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) = lines
        .iter()
        .filter(stream)
        .partition(|l| l["event"] == "message");
    // method → code → calls
    let mut by: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for l in &calls {
        *by.entry(l["method"].as_str().unwrap_or("").to_string())
            .or_default()
            .entry(l["code"].to_string())
            .or_default() += 1;
    }
    let items: u64 = messages.iter().filter_map(|m| m["items"].as_u64()).sum();
    eprintln!(
        "streams| 1.{minor}+crio: kubelet's streamed lists through crisp, calls by code: {by:?}; {} \
         messages shown by the tap, {items} items in them",
        messages.len()
    );
    assert!(
        calls.iter().any(|l| l["code"] == 0),
        "kubelet 1.{minor} on CRI-O made no streamed list that came back OK through crisp: {by:?}"
    );
    // Every OK call's messages reached the tap one by one, each counted in its call's line.
    let shown: usize = calls
        .iter()
        .filter_map(|l| l["messages"].as_u64())
        .sum::<u64>() as usize;
    assert!(
        !messages.is_empty() && shown == messages.len(),
        "the tap showed {} message events for calls that say they had {shown}",
        messages.len()
    );
}

/// The journal parser of the lane: kubelet's line naming the driver it took from the runtime,
/// and none when it fell back.
#[test]
fn the_cgroup_driver_kubelet_took_from_the_runtime_is_read_from_its_journal() {
    let took = "Nov 27 16:00:00 crisp-node kubelet[1]: I1127 16:00:00.1 1 server.go:1429] \"Using cgroup driver setting received from the CRI runtime\" cgroupDriver=\"cgroupfs\"\n";
    assert_eq!(driver_from_cri(took).as_deref(), Some("cgroupfs"));
    let fell = "Nov 27 16:00:00 crisp-node kubelet[1]: I1127 server.go:1406] \"CRI implementation should be updated to support RuntimeConfig. Falling back to using cgroupDriver from kubelet config.\"\n";
    assert_eq!(driver_from_cri(fell), None);
    let m = serde_json::json!({"config": {"mounts": [
        {"container_path": "/etc", "host_path": "/x"},
        {"container_path": "/vol", "image": {"image": "sha256:ab"}}
    ]}});
    assert!(has_image_mount(&m, "/vol"));
    assert!(!has_image_mount(&m, "/etc"));
}
