//! The newer-kubelet lanes (issue #34): the cluster lane of tests/it/cluster_rollout.rs (a real
//! control plane from hack/cluster.sh, the nspawn systemd node with containerd) with a kubelet
//! 1.30, 1.32 or 1.34 built by hack/kube-binaries.sh, joined with the KubeletCgroupDriverFromCRI
//! gate on (1.30–1.33; GA in 1.34) and a `tracing:` block to the lane's OTLP receiver
//! (tests/it/support/otlp.rs, on the node's loopback, which is this process's), where crisp's
//! `[tracing] otlp_endpoint` points too.
//!
//! `a_newer_kubelet_through_crisp`, from the API server, first with kubelet on containerd's
//! socket (direct), then on crisp's:
//! - a pod with a native sidecar (an init container with `restartPolicy: Always` and a
//!   startupProbe), Istio-, Linkerd- and Vault-shaped legacy pods (the injectors' own
//!   annotations and container names, readiness from crisp's injector table), a native sidecar
//!   without a startupProbe named in `crisp.dev/ready.proxy` (issue #35: direct, kubelet creates
//!   the app before it is ready) and a pod mixing a native sidecar with an annotated legacy one.
//!   The numbers come from the runtime's own timestamps (containerd's ContainerStatus: created,
//!   started, finished, in ns): sidecar started → app created, and app finished → sidecar
//!   finished after `kubectl delete`. Through crisp the legacy sidecars and the named native one
//!   are ready before their app is created, the legacy ones finish after it (the mixed pod's
//!   without waiting for its native sidecar, which kubelet stops last); the unnamed native
//!   sidecar is never held (no hold in the tap).
//! - through crisp only: a Job whose legacy sidecar never exits completes; a held
//!   CreateContainer as kubelet's span and crisp's hold span, its child, in one trace at the
//!   receiver; crisp SIGKILLed and restarted while it holds an app's CreateContainer, the pod
//!   still ordered; RuntimeConfig in the tap with the runtime's answer (containerd 1.6: its own
//!   Unimplemented, which kubelet's journal shows it fell back on, exactly as direct); a
//!   PullImage with an imagePullSecret, the credentials absent from the tap.
//! - 1.35 and 1.36 (issue #45, `cluster_newer_pods.rs`), direct and through crisp: an app
//!   restarted by a restart rule (not held again), a pod restarted in place (its second start
//!   ordered like the first), a non-UTF-8 env value (the same bytes in the container, decoded
//!   and redacted in the tap) and, with `CRIListStreaming` on in 1.36, the streamed lists
//!   answered by containerd itself.
//! - tracing: kubelet → recorder A → crisp → recorder B → containerd. The recorders (byte relays
//!   in this process, on sockets inside the node, reading the client's header blocks with their
//!   own HPACK decoder) keep each call's `traceparent`, `tracestate` and `baggage`; every call A
//!   saw reaches B with the same three values, so the runtime receives kubelet's trace context
//!   unchanged.
//!
//! Needs the binaries, so ignored by default; hack/lanes.sh runs it per version (lanes
//! kubelet-1.30, kubelet-1.32, kubelet-1.34):
//!   CRISP_KUBE_VERSION=1.34 CRISP_KUBE_BIN_DIR=DIR cargo test -p crisp --test it -- \
//!     cluster_kubelets:: --ignored --nocapture --test-threads 1

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster_rollout::{
    join_with, kube_bin_dir, kubelet_config_for, kubelet_flags_on, run, secs, BridgeGuard, Cluster,
    NODE,
};
use crate::node_support::*;
use k8s_cri::v1 as cri;

/// The kubelet minor under test: CRISP_KUBE_VERSION ("1.34"), checked against the binaries.
pub(crate) fn minor() -> u32 {
    let v = std::env::var("CRISP_KUBE_VERSION")
        .expect("CRISP_KUBE_VERSION: the kubelet minor under test, e.g. 1.34");
    v.strip_prefix("1.")
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("CRISP_KUBE_VERSION={v}: expected 1.<minor>"))
}

/// The lane's kubelet config: the 1.26 lane's, plus the cgroup-driver gate where it is not GA
/// yet, and tracing of every call to the lane's OTLP receiver ([`OTLP_ADDR`]; KubeletTracing is
/// beta and on by default from 1.27, GA in 1.34). From 1.35 on kubelet refuses to start on
/// cgroup v1, which these hosts run, unless `failCgroupV1: false` (KEP-5573; issue #45), and
/// checks pull credentials of images already on the node (KEP-2535): `NeverVerify` here.
pub(crate) fn kubelet_config(minor: u32) -> String {
    let mut c = kubelet_config_for(minor);
    if minor >= 35 {
        // The lane's pull-secret step pulls the same busybox (same image id) under another name
        // with a secret; from then on kubelet 1.35+ (KEP-2535, on by default) re-checks every
        // pod's right to that id and re-pulls `crisp.test/busybox:latest`, which no registry
        // serves: the tracing step's pod then waits in ImagePullBackOff (1.36.3, 2026-11-29).
        c += "# the lane's images are preloaded; one is also pulled with a secret (KEP-2535)\nimagePullCredentialsVerificationPolicy: NeverVerify\n";
    }
    let mut gates = String::new();
    if (28..34).contains(&minor) {
        gates += "  KubeletCgroupDriverFromCRI: true\n";
    }
    if minor >= 36 {
        // Streamed lists (KEP-5825, alpha in 1.36): kubelet falls back to the unary lists on
        // the runtime's Unimplemented (issue #45; `cluster_newer_pods::streamed_lists`).
        gates += "  CRIListStreaming: true\n";
    }
    if minor < 27 {
        // alpha before 1.27: the harness's own check on the 1.26 binaries
        gates += "  KubeletTracing: true\n";
    }
    if !gates.is_empty() {
        c += &format!("featureGates:\n{gates}");
    }
    c += &format!("tracing:\n  endpoint: {OTLP_ADDR}\n  samplingRatePerMillion: 1000000\n");
    c
}

/// Where the lane's OTLP/gRPC receiver listens, for kubelet and crisp alike. The node shares the
/// host's network namespace (cluster_rollout.rs, `BRIDGE`), so the node's loopback is this
/// process's: no setns and no bridge address needed.
const OTLP_ADDR: &str = "127.0.0.1:14317";

/// crisp's config in the node: its hold spans to the lane's receiver, sent every 200 ms.
pub(crate) fn crisp_config() -> String {
    format!("[tracing]\notlp_endpoint = \"http://{OTLP_ADDR}\"\nexport_delay = \"200ms\"\n")
}

/// Every span kubelet and crisp exported to [`OTLP_ADDR`] (`tests/it/support/otlp.rs`).
pub(crate) struct Spans {
    _rt: tokio::runtime::Runtime,
    all: Arc<Mutex<Vec<crate::support::Exported>>>,
}

impl Spans {
    pub(crate) fn start() -> Spans {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let l = rt
            .block_on(tokio::net::TcpListener::bind(OTLP_ADDR))
            .unwrap_or_else(|e| panic!("the lane's OTLP receiver on {OTLP_ADDR}: {e}"));
        let all: Arc<Mutex<Vec<crate::support::Exported>>> = Arc::default();
        let keep = all.clone();
        rt.spawn(async move {
            let mut rx = crate::support::otlp_receiver(l);
            while let Some(e) = rx.recv().await {
                keep.lock().unwrap().push(e);
            }
        });
        Spans { _rt: rt, all }
    }

    /// Waits until `f` finds something among the spans so far (kubelet's exporter sends every
    /// 5 s).
    fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&[crate::support::Exported]) -> Option<T>,
    ) -> T {
        let t = Instant::now();
        loop {
            if let Some(v) = f(&self.all.lock().unwrap()) {
                return v;
            }
            assert!(
                t.elapsed() < timeout,
                "no {what} at the OTLP receiver in {timeout:?} ({} spans there)",
                self.all.lock().unwrap().len()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A socket inside the node, as the host reaches it (the node's /run is its own tmpfs).
pub(crate) fn in_node(node: &Node, p: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root{p}", node.init))
}

/// Moves kubelet onto `endpoint` (a unix socket path inside the node) and waits until the node
/// is Ready again on it.
pub(crate) fn kubelet_on(cluster: &Cluster, node: &Node, endpoint: &str) {
    let inv = node.prop("kubelet.service", "InvocationID");
    kubelet_flags_on(node, &format!("unix://{endpoint}"));
    let restarted = epoch_secs();
    let o = node.nsenter(&["systemctl", "restart", "kubelet.service"]);
    assert!(o.ok(), "restart kubelet: {}", o.all());
    assert_ne!(node.prop("kubelet.service", "InvocationID"), inv);
    // Ready counts only from the new kubelet's first status update on.
    let t = Instant::now();
    let ready = || {
        let hb = cluster.jsonpath(
            &["node", NODE],
            "{.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}",
        );
        let at = run(Command::new("date").args(["-u", "-d", &hb, "+%s"]))
            .stdout
            .trim()
            .parse::<u64>()
            .unwrap_or(0);
        at >= restarted && cluster.node_ready() == "True"
    };
    while !ready() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "kubelet on {endpoint} not Ready in 120 s; its journal:\n{}",
            node.journal("kubelet", 80)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cmdline = node.kubelet_cmdline();
    assert!(
        cmdline.contains(&format!("--container-runtime-endpoint=unix://{endpoint}")),
        "kubelet runs on {endpoint}: {cmdline}"
    );
}

// --- crisp in the node, and its tap ----------------------------------------------------------

const CRISP_UNIT: &str = "crisp-lane";

/// Starts the lane's crisp in front of `upstream` and waits until its CRI and admin sockets
/// accept.
pub(crate) fn crisp_start(node: &Node, upstream: &str) {
    node.start_crisp(CRISP_UNIT, upstream);
    node.wait_accepting(
        CRISP_UNIT,
        &["/run/crisp/crisp.sock", "/run/crisp/admin.sock"],
    );
}

/// crisp in the node in front of `upstream`, with `crisp tap --json --full --all` attached (a
/// call of ours seen in it) before kubelet moves onto it.
pub(crate) fn crisp_with_tap(node: &Node, rt: &Runtime, upstream: &str, dir: &Path) -> Tap {
    node.put_crisp();
    crisp_start(node, upstream);
    let mut tap = Tap::new(node, dir);
    tap.attach();
    let crisp_sock = in_node(node, "/run/crisp/crisp.sock");
    let t = Instant::now();
    while !tap.lines().iter().any(|l| l["method"] == "Version") {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the tap never showed a call"
        );
        rt.rt.block_on(async {
            let mut c = crate::support::runtime_client(&crisp_sock).await;
            c.version(cri::VersionRequest::default())
                .await
                .expect("Version through crisp");
        });
        std::thread::sleep(Duration::from_millis(200));
    }
    tap
}

pub(crate) fn crisp_kill(node: &Node) {
    node.kill_crisp(CRISP_UNIT);
}

/// `crisp tap --json --full --all` from the host on the node's admin socket, appending every
/// line to one file across crisp restarts (`attach` again after a restart).
pub(crate) struct Tap {
    pub(crate) file: PathBuf,
    child: Option<Child>,
    admin: PathBuf,
}

impl Tap {
    pub(crate) fn new(node: &Node, dir: &Path) -> Tap {
        Tap {
            file: dir.join("tap.jsonl"),
            child: None,
            admin: in_node(node, "/run/crisp/admin.sock"),
        }
    }

    pub(crate) fn attach(&mut self) {
        self.detach();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .unwrap();
        let child = Command::new(crate::node_support::crisp_bin())
            .args(["tap", "--json", "--full", "--all", "--admin-socket"])
            .arg(&self.admin)
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .expect("crisp tap");
        self.child = Some(child);
    }

    pub(crate) fn detach(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The tap process's CPU time so far (utime + stime), in seconds; 0 when detached.
    pub(crate) fn cpu_secs(&self) -> f64 {
        self.child.as_ref().map_or(0.0, |c| {
            crate::cluster_observers::cpu_secs(
                &std::fs::read_to_string(format!("/proc/{}/stat", c.id())).unwrap_or_default(),
            )
        })
    }

    /// Bytes the tap has written to its file.
    pub(crate) fn bytes(&self) -> u64 {
        std::fs::metadata(&self.file).map_or(0, |m| m.len())
    }

    pub(crate) fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until a line satisfies `f` (the tap's subscriber is attached asynchronously).
    pub(crate) fn wait_line(
        &self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&serde_json::Value) -> bool,
    ) {
        let t = Instant::now();
        while !self.lines().iter().any(&f) {
            assert!(t.elapsed() < timeout, "no tap line for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.detach();
    }
}

// --- the runtime's own view -----------------------------------------------------------------

/// containerd's timestamps of one container (ns since the epoch; 0: not yet).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Times {
    pub(crate) created: i64,
    pub(crate) started: i64,
    pub(crate) finished: i64,
}

/// ContainerStatus from the runtime itself, on its socket in the node (never through crisp).
pub(crate) struct Runtime {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) sock: PathBuf,
}

/// kubelet's label on a pod's sandbox and containers, as a CRI list filter's selector.
fn pod_labels(pod: &str) -> std::collections::HashMap<String, String> {
    [("io.kubernetes.pod.name".to_string(), pod.to_string())]
        .into_iter()
        .collect()
}

impl Runtime {
    /// containerd in the node.
    pub(crate) fn new(node: &Node) -> Runtime {
        Runtime::at(node, "/run/containerd/containerd.sock")
    }

    /// The runtime on `sock`, a path inside the node.
    pub(crate) fn at(node: &Node, sock: &str) -> Runtime {
        Runtime {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            sock: in_node(node, sock),
        }
    }

    /// The pod's containers, name → (id, attempt), the latest attempt of each, in the pod's
    /// newest sandbox: the lane runs each pod twice under one name (direct, then through
    /// crisp), and the direct run's exited containers can still be listed when kubelet has not
    /// removed them yet. Read by name alone, they were taken for the second run's (equal
    /// attempt 0) and made an ordered pod look unordered: the 1.36 lane's "mixed" failures of
    /// 2026-11-29 (runs c and a later one, whose crisp journal showed the app held 2,660 ms
    /// until its sidecar was ready while the times read were the direct run's).
    pub(crate) fn containers(&self, pod: &str) -> BTreeMap<String, (String, u32)> {
        let sandbox = self.sandbox_id(pod);
        self.rt.block_on(async {
            let mut c = crate::support::runtime_client(&self.sock).await;
            let filter = cri::ContainerFilter {
                pod_sandbox_id: sandbox,
                label_selector: pod_labels(pod),
                ..Default::default()
            };
            let list = c
                .list_containers(cri::ListContainersRequest {
                    filter: Some(filter),
                })
                .await
                .expect("ListContainers")
                .into_inner();
            let mut m: BTreeMap<String, (String, u32)> = BTreeMap::new();
            for ct in list.containers {
                let md = ct.metadata.unwrap_or_default();
                let e = m.entry(md.name).or_insert((ct.id.clone(), md.attempt));
                if md.attempt > e.1 {
                    *e = (ct.id, md.attempt);
                }
            }
            m
        })
    }

    /// The pod's sandbox id (the newest, if kubelet made several).
    pub(crate) fn sandbox_id(&self, pod: &str) -> String {
        self.rt.block_on(async {
            let mut c = crate::support::runtime_client(&self.sock).await;
            let filter = cri::PodSandboxFilter {
                label_selector: pod_labels(pod),
                ..Default::default()
            };
            let list = c
                .list_pod_sandbox(cri::ListPodSandboxRequest {
                    filter: Some(filter),
                })
                .await
                .expect("ListPodSandbox")
                .into_inner();
            list.items
                .into_iter()
                .max_by_key(|s| s.created_at)
                .map(|s| s.id)
                .unwrap_or_default()
        })
    }

    /// The container's status (not verbose); None when the runtime does not answer it.
    pub(crate) fn status(&self, id: &str) -> Option<cri::ContainerStatus> {
        self.rt.block_on(async {
            let mut c = crate::support::runtime_client(&self.sock).await;
            c.container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .ok()?
            .into_inner()
            .status
        })
    }

    pub(crate) fn times(&self, id: &str) -> Option<Times> {
        let s = self.status(id)?;
        Some(Times {
            created: s.created_at,
            started: s.started_at,
            finished: s.finished_at,
        })
    }

    /// The container's CPU quota as the runtime reports it (ContainerStatus.resources; 0: none).
    pub(crate) fn cpu_quota(&self, id: &str) -> i64 {
        self.status(id)
            .and_then(|s| s.resources)
            .and_then(|r| r.linux)
            .map(|l| l.cpu_quota)
            .unwrap_or(0)
    }

    pub(crate) fn pod_times(&self, pod: &str) -> BTreeMap<String, Times> {
        self.containers(pod)
            .into_iter()
            .filter_map(|(n, (id, _))| Some((n, self.times(&id)?)))
            .collect()
    }
}

// --- pods ------------------------------------------------------------------------------------

pub(crate) const APP: &str =
    "trap 'sleep 2; exit 0' TERM; echo app up; while true; do sleep 1 & wait $!; done";
/// How long a sidecar takes to turn ready after it started.
pub(crate) const READY_AFTER: Duration = Duration::from_secs(3);

/// A sidecar that turns ready READY_AFTER after it starts (a file, or an HTTP path served by
/// busybox httpd) and exits at once on SIGTERM.
fn sidecar(http: Option<(u16, &str)>) -> String {
    let ready = match http {
        None => "touch /tmp/ready".to_string(),
        Some((port, path)) => {
            format!("mkdir -p /www$(dirname {path}); echo ok >/www{path}; httpd -p {port} -h /www")
        }
    };
    format!(
        "trap 'exit 0' TERM; sleep {}; {ready}; while true; do sleep 1 & wait $!; done",
        READY_AFTER.as_secs()
    )
}

fn container(name: &str, script: &str, extra: &str) -> String {
    format!("  - name: {name}\n    image: crisp.test/busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n{extra}")
}

const EXIT0: &str = "exit 0";

/// The pods of the lane: (name, YAML, the sidecars whose order is checked, the legacy ones of
/// them that crisp orders at create, and at stop).
pub(crate) struct Shape {
    pub(crate) name: &'static str,
    /// "native", "legacy", "legacy, stop only", "native named in crisp.dev/ready": for the log.
    kind: &'static str,
    yaml: String,
    pub(crate) sidecar: &'static str,
    /// crisp holds the app until the sidecar is ready (the create order is crisp's).
    pub(crate) ordered_create: bool,
    /// crisp holds the sidecar's stop until the app exited.
    pub(crate) ordered_stop: bool,
}

fn pod(name: &str, annotations: &str, init: &[String], containers: &[String]) -> String {
    let mut y = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  annotations:\n    lane.crisp.dev/shape: {name:?}\n{annotations}spec:\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 15\n");
    if !init.is_empty() {
        y += "  initContainers:\n";
        for c in init {
            y += c;
        }
    }
    y += "  containers:\n";
    for c in containers {
        y += c;
    }
    y
}

fn native_sidecar(name: &str) -> String {
    container(
        name,
        &sidecar(None),
        "    restartPolicy: Always\n    startupProbe:\n      exec:\n        command: [\"test\", \"-e\", \"/tmp/ready\"]\n      periodSeconds: 1\n      failureThreshold: 60\n",
    )
}

/// The lane's pods; without native sidecars (before 1.29) the ones that have one are left out.
pub(crate) fn shapes(minor: u32) -> Vec<Shape> {
    let mut v = vec![
        Shape {
            name: "native",
            kind: "native",
            yaml: pod(
                "native",
                "",
                &[native_sidecar("proxy")],
                &[container("app", APP, "")],
            ),
            sidecar: "proxy",
            ordered_create: false,
            ordered_stop: false,
        },
        // Istio's default injection: istio-init, the app, then istio-proxy appended after it;
        // readiness on :15021/healthz/ready (crisp's injector table).
        Shape {
            name: "istio",
            kind: "legacy",
            yaml: pod(
                "istio",
                "    sidecar.istio.io/status: '{\"initContainers\":[\"istio-init\"],\"containers\":[\"istio-proxy\"],\"volumes\":[\"istio-envoy\"],\"imagePullSecrets\":null}'\n",
                &[container("istio-init", EXIT0, "")],
                &[
                    container("app", APP, ""),
                    container("istio-proxy", &sidecar(Some((15021, "/healthz/ready"))), ""),
                ],
            ),
            sidecar: "istio-proxy",
            ordered_create: true,
            ordered_stop: true,
        },
        // Linkerd: linkerd-init, linkerd-proxy first, readiness on :4191/ready.
        Shape {
            name: "linkerd",
            kind: "legacy",
            yaml: pod(
                "linkerd",
                "    linkerd.io/proxy-version: \"stable-2.14.10\"\n",
                &[container("linkerd-init", EXIT0, "")],
                &[
                    container("linkerd-proxy", &sidecar(Some((4191, "/ready"))), ""),
                    container("app", APP, ""),
                ],
            ),
            sidecar: "linkerd-proxy",
            ordered_create: true,
            ordered_stop: true,
        },
        // Vault's agent: vault-agent-init, the app, vault-agent appended (readiness `running`,
        // ordered once it exists: only its stop is crisp's).
        Shape {
            name: "vault",
            kind: "legacy, stop only",
            yaml: pod(
                "vault",
                "    vault.hashicorp.com/agent-inject-status: injected\n",
                &[container("vault-agent-init", EXIT0, "")],
                &[
                    container("app", APP, ""),
                    container("vault-agent", &sidecar(None), ""),
                ],
            ),
            sidecar: "vault-agent",
            ordered_create: false,
            ordered_stop: true,
        },
        // Issue #35: a native sidecar without a startupProbe, so kubelet starts the app as soon
        // as the sidecar's process runs; named in crisp.dev/ready.proxy, crisp holds the app's
        // CreateContainer until it is ready. Stops stay kubelet's.
        Shape {
            name: "native-ready",
            kind: "native named in crisp.dev/ready",
            yaml: pod(
                "native-ready",
                "    crisp.dev/ready.proxy: 'exec:[\"test\",\"-e\",\"/tmp/ready\"]'\n",
                &[container(
                    "proxy",
                    &sidecar(None),
                    "    restartPolicy: Always\n",
                )],
                &[container("app", APP, "")],
            ),
            sidecar: "proxy",
            ordered_create: true,
            ordered_stop: false,
        },
        // A native sidecar beside an annotated legacy one listed after the app.
        Shape {
            name: "mixed",
            kind: "native + legacy",
            yaml: pod(
                "mixed",
                "    crisp.dev/sidecars: \"legacy-proxy\"\n    crisp.dev/ready.legacy-proxy: 'exec:[\"test\",\"-e\",\"/tmp/ready\"]'\n",
                &[native_sidecar("native-proxy")],
                &[
                    container("app", APP, ""),
                    container("legacy-proxy", &sidecar(None), ""),
                ],
            ),
            sidecar: "legacy-proxy",
            ordered_create: true,
            ordered_stop: true,
        },
    ];
    if minor < 29 {
        v.retain(|s| !s.kind.starts_with("native"));
    }
    v
}

/// What one pod showed: sidecar started → app created, and app finished → sidecar finished
/// (ms, from containerd's timestamps).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gaps {
    pub(crate) create_ms: f64,
    pub(crate) stop_ms: f64,
}

/// "created after ready, stopped last" and the like, for the log.
pub(crate) fn verdict(s: &Shape, g: &Gaps) -> String {
    let create = if g.create_ms >= READY_AFTER.as_millis() as f64 - 100.0 {
        "app created after the sidecar was ready"
    } else if g.create_ms >= 0.0 {
        "app created before the sidecar was ready"
    } else {
        "app created before the sidecar started"
    };
    let stop = if g.stop_ms >= 0.0 {
        "sidecar finished last"
    } else {
        "sidecar finished first"
    };
    format!("{}: {create}, {stop}", s.kind)
}

pub(crate) fn ms(a: i64, b: i64) -> f64 {
    (b - a) as f64 / 1e6
}

/// Each container's finish, ms after the app's (`app +0 ms, proxy +132 ms`): who waited for
/// whom at the stop.
pub(crate) fn stop_order(t: &BTreeMap<String, Times>) -> String {
    let app_end = t["app"].finished;
    t.iter()
        .map(|(n, x)| format!("{n} {:+.0} ms", ms(app_end, x.finished)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Creates the pod, waits until every container runs, deletes it and follows the stops in
/// containerd until each container finished.
pub(crate) fn run_shape(
    cluster: &Cluster,
    rt: &Runtime,
    s: &Shape,
) -> (Gaps, BTreeMap<String, Times>) {
    cluster.apply(&s.yaml);
    let want = if s.name == "mixed" { 3 } else { 2 };
    cluster.wait(
        &format!("pod {} running", s.name),
        Duration::from_secs(180),
        || {
            let t = rt.pod_times(s.name);
            t.values()
                .filter(|t| t.started > 0 && t.finished == 0)
                .count()
                >= want
                && cluster.pod_ready("default", s.name)
        },
    );
    let ids = rt.containers(s.name);
    // A container kubelet re-created: its times below are the newest instance's, which can
    // make an ordered pod look unordered (or the reverse); say so.
    let again: Vec<String> = ids
        .iter()
        .filter(|(_, (_, attempt))| *attempt > 0)
        .map(|(name, (_, attempt))| format!("{name} attempt {attempt}"))
        .collect();
    if !again.is_empty() {
        eprintln!("attempts| {}: re-created: {}", s.name, again.join(", "));
    }
    let mut times = rt.pod_times(s.name);
    let o = cluster.kubectl(&["delete", "pod", s.name, "--wait=false"]);
    assert!(o.ok(), "delete {}: {}", s.name, o.all());
    // Every 50 ms until each running container finished (kubelet removes a deleted pod's dead
    // containers about a second after they exit).
    let t = Instant::now();
    loop {
        for (name, (id, _)) in &ids {
            if let Some(now) = rt.times(id) {
                times.insert(name.clone(), now);
            }
        }
        if times.values().all(|t| t.finished > 0 || t.started == 0) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "pod {}'s containers never all finished: {times:?}",
            s.name
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.wait(
        &format!("pod {} gone", s.name),
        Duration::from_secs(120),
        || {
            cluster
                .kubectl(&["get", "pod", s.name, "--ignore-not-found", "-o", "name"])
                .stdout
                .trim()
                .is_empty()
        },
    );
    let (app, side) = (times["app"], times[s.sidecar]);
    (
        Gaps {
            create_ms: ms(side.started, app.created),
            stop_ms: ms(app.finished, side.finished),
        },
        times,
    )
}

// --- the trace-context recorders -------------------------------------------------------------

/// (path, traceparent, tracestate, baggage) of one call.
type Seen = (String, String, String, String);

/// A relay on `listen` to `upstream` (one upstream connection per downstream one, as crisp and
/// kubelet use them) that copies every byte both ways as it came, and reads the client's HTTP/2
/// header blocks with its own HPACK decoder to keep each request's trace headers. Being no
/// HTTP/2 endpoint itself, it takes any `:authority` — kubelet 1.30.1's socket path too, which
/// an HTTP/2 server library refuses (RST_STREAM PROTOCOL_ERROR: the lane's earlier hyper
/// recorders could not run on 1.30).
fn recorder(
    rt: &tokio::runtime::Runtime,
    listen: PathBuf,
    upstream: PathBuf,
) -> Arc<Mutex<Vec<Seen>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let _ = std::fs::remove_file(&listen);
    std::fs::create_dir_all(listen.parent().unwrap()).unwrap();
    let l = rt
        .block_on(async { tokio::net::UnixListener::bind(&listen) })
        .unwrap();
    let log = seen.clone();
    rt.spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let (up, log) = (upstream.clone(), log.clone());
            tokio::spawn(async move {
                let Ok(us) = tokio::net::UnixStream::connect(&up).await else {
                    return;
                };
                let (mut from_client, mut to_client) = s.into_split();
                let (mut from_up, mut to_up) = us.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_up, &mut to_client).await;
                    let _ = to_client.shutdown().await;
                });
                let mut reader = H2Requests::default();
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = from_client.read(&mut buf).await {
                    if n == 0 || to_up.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    reader.feed(&buf[..n], &log);
                }
                let _ = to_up.shutdown().await;
            });
        }
    });
    seen
}

/// The client side of one HTTP/2 connection, read passively: frames as they arrive, header
/// blocks (HEADERS and CONTINUATION) decoded with the connection's HPACK table.
struct H2Requests {
    buf: Vec<u8>,
    preface: bool,
    block: Vec<u8>,
    hpack: httlib_hpack::Decoder<'static>,
    /// A block did not decode: nothing after it can be read (the table is lost).
    broken: bool,
}

impl Default for H2Requests {
    fn default() -> Self {
        H2Requests {
            buf: Vec::new(),
            preface: false,
            block: Vec::new(),
            hpack: httlib_hpack::Decoder::with_dynamic_size(4096),
            broken: false,
        }
    }
}

impl H2Requests {
    const PREFACE: &'static [u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn feed(&mut self, data: &[u8], log: &Mutex<Vec<Seen>>) {
        if self.broken {
            return;
        }
        self.buf.extend_from_slice(data);
        if !self.preface {
            if self.buf.len() < Self::PREFACE.len() {
                return;
            }
            assert_eq!(
                &self.buf[..Self::PREFACE.len()],
                Self::PREFACE,
                "not HTTP/2"
            );
            self.buf.drain(..Self::PREFACE.len());
            self.preface = true;
        }
        while self.buf.len() >= 9 {
            let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]) as usize;
            if self.buf.len() < 9 + len {
                return;
            }
            let (kind, flags) = (self.buf[3], self.buf[4]);
            let payload: Vec<u8> = self.buf[9..9 + len].to_vec();
            self.buf.drain(..9 + len);
            let fragment = match kind {
                // HEADERS: less its padding (PADDED) and priority fields (PRIORITY).
                0x1 => {
                    let pad = if flags & 0x8 != 0 {
                        payload[0] as usize
                    } else {
                        0
                    };
                    let start =
                        usize::from(flags & 0x8 != 0) + if flags & 0x20 != 0 { 5 } else { 0 };
                    payload[start..payload.len() - pad].to_vec()
                }
                0x9 => payload,
                _ => continue,
            };
            self.block.extend_from_slice(&fragment);
            if flags & 0x4 != 0 {
                let mut block = std::mem::take(&mut self.block);
                let mut fields = Vec::new();
                if let Err(e) = self.hpack.decode(&mut block, &mut fields) {
                    eprintln!("recorder: a header block did not decode ({e:?}); no more calls read on this connection");
                    self.broken = true;
                    return;
                }
                let h = |k: &str| {
                    fields
                        .iter()
                        .find(|(n, _, _)| n.as_slice() == k.as_bytes())
                        .map(|(_, v, _)| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default()
                };
                // Trailers carry no :path.
                if !h(":path").is_empty() {
                    log.lock().unwrap().push((
                        h(":path"),
                        h("traceparent"),
                        h("tracestate"),
                        h("baggage"),
                    ));
                }
            }
        }
    }
}

// --- the lane ---------------------------------------------------------------------------------

pub(crate) fn journal_since(node: &Node, unit: &str, since: &str) -> String {
    node.nsenter(&["journalctl", "-u", unit, "--since", since, "--no-pager"])
        .stdout
}

pub(crate) fn node_now(node: &Node) -> String {
    node.nsenter(&["date", "+%Y-%m-%d %H:%M:%S"])
        .stdout
        .trim()
        .to_string()
}

/// kubelet's journal line when the runtime does not implement RuntimeConfig (1.30–1.34 wording:
/// "CRI implementation should be updated to support RuntimeConfig ...").
fn fell_back(journal: &str) -> bool {
    journal
        .lines()
        .any(|l| l.contains("RuntimeConfig") && l.contains("cgroupDriver"))
}

#[test]
#[ignore = "needs Kubernetes binaries: CRISP_KUBE_VERSION=1.34 CRISP_KUBE_BIN_DIR=... cargo test --test it -- cluster_kubelets:: --ignored (hack/lanes.sh kubelet-1.34)"]
fn a_newer_kubelet_through_crisp() {
    let minor = minor();
    let bins = kube_bin_dir();
    let _bridge = BridgeGuard;
    let spans = Spans::start();
    let cluster = Cluster::up(&bins);
    let (node, joined) = join_with(&cluster, &bins, &kubelet_config(minor));
    let version = cluster.versions();
    assert!(
        version.starts_with(&format!("v1.{minor}.")),
        "kubelet {version}, not 1.{minor}"
    );
    eprintln!("kubelet joined, node Ready in {}: {version}", secs(joined));
    let rt = Runtime::new(&node);
    let work = tempfile::Builder::new()
        .prefix("cluster-kubelets")
        .tempdir_in(Path::new(REPO).join("target"))
        .unwrap();

    // CRISP_LANE_TRACING_ONLY=1: only step 3 (to look into it without the other steps' time).
    if std::env::var_os("CRISP_LANE_TRACING_ONLY").is_some() {
        node.put_crisp();
        node.put("/etc/crisp/config.toml", crisp_config().as_bytes(), 0o644);
        crisp_start(&node, "/run/containerd/containerd.sock");
        tracing_through_crisp(&cluster, &node, minor);
        return;
    }

    // 1. Direct: kubelet on containerd.
    let direct_journal = node
        .nsenter(&["journalctl", "-u", "kubelet", "--no-pager"])
        .stdout;
    let direct_fallback = fell_back(&direct_journal);
    eprintln!(
        "direct: kubelet fell back from RuntimeConfig to its cgroupDriver: {direct_fallback}"
    );
    let mut direct = BTreeMap::new();
    for s in shapes(minor) {
        let (g, _) = run_shape(&cluster, &rt, &s);
        eprintln!(
            "gaps| 1.{minor} direct {:8} sidecar {:13} started→app created {:8.0} ms, app finished→sidecar finished {:8.0} ms ({})",
            s.name, s.sidecar, g.create_ms, g.stop_ms, verdict(&s, &g)
        );
        if s.name == "native-ready" {
            // kubelet alone waits only for the sidecar's start (there is no startupProbe).
            assert!(
                g.create_ms < READY_AFTER.as_millis() as f64 - 100.0,
                "direct, kubelet created the app {:.0} ms after the native sidecar started: not the premise",
                g.create_ms
            );
        }
        direct.insert(s.name, g);
    }
    // Restart rules, an in-place pod restart, bytes in env (1.35+, 1.36+).
    let direct_rows = crate::cluster_newer_pods::run(&cluster, &rt, minor, "direct", None);

    // 2. Through crisp, its tap attached before kubelet's first call.
    node.put("/etc/crisp/config.toml", crisp_config().as_bytes(), 0o644);
    let mut tap = crisp_with_tap(&node, &rt, "/run/containerd/containerd.sock", work.path());
    let since = node_now(&node);
    kubelet_on(&cluster, &node, "/run/crisp/crisp.sock");
    let journal = journal_since(&node, "kubelet", &since);
    let lines = tap.lines();
    let rc: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["method"] == "RuntimeConfig")
        .collect();
    // kubelet asks from 1.28 on, with the gate.
    assert_eq!(
        !rc.is_empty(),
        minor >= 28,
        "kubelet 1.{minor}: {} RuntimeConfig call(s) through crisp",
        rc.len()
    );
    assert!(
        !lines
            .iter()
            .any(|l| l["method"] == "RuntimeConfig" && l.get("hold").is_some()),
        "crisp held a RuntimeConfig"
    );
    for l in &rc {
        // containerd 1.6 does not serve it: its own Unimplemented ("unknown method"), relayed.
        assert!(
            l["code"] == 0
                || l["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("unknown method RuntimeConfig"),
            "RuntimeConfig answered by someone else than containerd: {l}"
        );
    }
    let crisp_fallback = fell_back(&journal);
    assert_eq!(
        crisp_fallback, direct_fallback,
        "kubelet's cgroup driver decision differs through crisp"
    );
    eprintln!(
        "runtime-config| 1.{minor}: {} RuntimeConfig call(s) in the tap, code {} {:?}; kubelet fell back to its cgroupDriver: direct {direct_fallback}, through crisp {crisp_fallback}",
        rc.len(),
        rc.first().map(|l| l["code"].clone()).unwrap_or_default(),
        rc.first().and_then(|l| l["message"].as_str()).unwrap_or("")
    );

    let mut through = BTreeMap::new();
    for s in shapes(minor) {
        let (g, t) = run_shape(&cluster, &rt, &s);
        eprintln!(
            "gaps| 1.{minor} crisp  {:8} sidecar {:13} started→app created {:8.0} ms, app finished→sidecar finished {:8.0} ms ({})",
            s.name, s.sidecar, g.create_ms, g.stop_ms, verdict(&s, &g)
        );
        if s.ordered_create {
            assert!(
                g.create_ms >= READY_AFTER.as_millis() as f64 - 100.0,
                "{}: the app was created {:.0} ms after {} started, before it was ready ({READY_AFTER:?}): {t:?}\ncrisp's journal on it:\n{}",
                s.name,
                g.create_ms,
                s.sidecar,
                node.nsenter(&["journalctl", "-u", CRISP_UNIT, "--no-pager"])
                    .stdout
                    .lines()
                    .filter(|l| l.contains(s.name) || l.contains("WARN") || l.contains("ERROR"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        if s.ordered_stop {
            assert!(
                g.stop_ms >= 0.0,
                "{}: {} finished {:.0} ms before the app: {t:?}",
                s.name,
                s.sidecar,
                -g.stop_ms
            );
        }
        if s.name == "mixed" {
            // The native sidecar is no app the legacy one's stop waits for (kubelet stops it
            // only after every regular container): the app's 2 s SIGTERM trap, not the budget.
            assert!(
                g.stop_ms < 5000.0,
                "mixed: the legacy sidecar finished {:.0} ms after the app (its stop waited for the native sidecar?): {t:?}",
                g.stop_ms
            );
        }
        eprintln!("stops| 1.{minor} crisp  {:8} {}", s.name, stop_order(&t));
        through.insert(s.name, g);
    }
    let rows = crate::cluster_newer_pods::run(&cluster, &rt, minor, "crisp", Some(&tap));
    if let (Some(d), Some(c)) = (direct_rows.rule_recreate_ms, rows.rule_recreate_ms) {
        eprintln!(
            "rule| 1.{minor}: app exit → re-created: direct {d:.0} ms, through crisp {c:.0} ms"
        );
    }
    if let (Some(d), Some(c)) = (direct_rows.in_place_create_ms, rows.in_place_create_ms) {
        eprintln!("inplace| 1.{minor}: second sidecar started → second app created: direct {d:.0} ms, through crisp {c:.0} ms");
    }
    if let (Some(d), Some(c)) = (&direct_rows.env_bytes, &rows.env_bytes) {
        assert_eq!(d, c, "the non-UTF-8 env value differs through crisp");
    }
    if minor >= 36 {
        crate::cluster_newer_pods::streamed_lists(&tap, minor);
    }
    // The native sidecar is kubelet's: crisp held and refused none of its calls.
    let native_holds: Vec<serde_json::Value> = tap
        .lines()
        .into_iter()
        .filter(|l| {
            l["pod_name"] == "native"
                && (l.get("hold").is_some() || (l["method"] == "CreateContainer" && l["code"] != 0))
        })
        .collect();
    assert!(
        native_holds.is_empty(),
        "crisp held the native-sidecar pod: {native_holds:?}"
    );
    let native_held = tap
        .lines()
        .iter()
        .filter(|l| l["pod_name"] == "native")
        .filter_map(|l| l["held_ms"].as_f64())
        .fold(0.0, f64::max);
    if let (Some(d), Some(c)) = (direct.get("native"), through.get("native")) {
        eprintln!(
            "native| 1.{minor}: sidecar started→app created direct {:.0} ms, through crisp {:.0} ms; 0 holds or refusals; longest time any of its calls spent in crisp before the runtime {:.3} ms",
            d.create_ms, c.create_ms, native_held
        );
    }

    job_completes(&cluster, &format!("1.{minor}"));
    held_in_kubelets_trace(&cluster, &spans, &format!("1.{minor}"));
    restart_mid_hold(
        &cluster,
        &node,
        &rt,
        &mut tap,
        "/run/containerd/containerd.sock",
        &format!("1.{minor}"),
    );

    // PullImage with an imagePullSecret: the credentials never reach the tap.
    let images = Path::new(REPO).join("target/cluster-images");
    let image = format!("127.0.0.1:{}/lane/busybox:secret", cluster.registry_port);
    let o = run(Command::new("skopeo")
        .arg("copy")
        .arg("--dest-tls-verify=false")
        .arg(format!(
            "oci-archive:{}",
            images.join("busybox.tar").display()
        ))
        .arg(format!("docker://{image}")));
    assert!(
        o.ok(),
        "skopeo copy busybox into the lane's registry: {}",
        o.all()
    );
    let password = "lane-Pa55-do-not-show";
    cluster.must(&[
        "create",
        "secret",
        "docker-registry",
        "lane-pull",
        &format!("--docker-server=127.0.0.1:{}", cluster.registry_port),
        "--docker-username=lane-user",
        &format!("--docker-password={password}"),
    ]);
    cluster.apply(&format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: pull-secret\n  namespace: default\nspec:\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  imagePullSecrets:\n  - name: lane-pull\n  containers:\n  - name: app\n    image: {image}\n    imagePullPolicy: Always\n    command: [\"sh\", \"-c\", \"exec sleep 3600\"]\n"));
    cluster.wait("pull-secret Running", Duration::from_secs(120), || {
        cluster.jsonpath(&["pod", "pull-secret"], "{.status.phase}") == "Running"
    });
    tap.wait_line(
        "PullImage of the secret image",
        Duration::from_secs(30),
        |l| l["method"] == "PullImage" && l.to_string().contains("lane/busybox:secret"),
    );
    let raw = std::fs::read_to_string(&tap.file).unwrap();
    let b64 = run(Command::new("sh").args([
        "-c",
        &format!("printf %s lane-user:{password} | base64 -w0"),
    ]))
    .stdout;
    assert!(
        !raw.contains(password) && !raw.contains(b64.trim()),
        "registry credentials in the tap"
    );
    let pull: Vec<serde_json::Value> = tap
        .lines()
        .into_iter()
        .filter(|l| l["method"] == "PullImage" && l.to_string().contains("lane/busybox:secret"))
        .collect();
    assert!(pull.iter().all(|l| l["redacted"] == true), "{pull:?}");
    eprintln!("pull| 1.{minor}: PullImage with an imagePullSecret: {} call(s), redacted, no credential in {} tap bytes; auth {}", pull.len(), raw.len(), pull[0]["request"]["auth"]);
    let _ = cluster.kubectl(&["delete", "pod", "pull-secret", "--wait=false"]);

    // 3. Tracing: the recorders around crisp, for every kubelet (1.30.1 sends its socket path as
    // `:authority`; the recorders only copy bytes, so they take it).
    tap.detach();
    tracing_through_crisp(&cluster, &node, minor);
    crisp_kill(&node);
    eprintln!(
        "summary| 1.{minor} ({version}): direct {:?} / through crisp {:?}",
        direct, through
    );
    let _ = std::io::stderr().flush();
    drop(node);
}

/// A Job whose legacy sidecar never exits completes (crisp ends the sidecar when the app has
/// finished). `tag` names the lane in the printed row.
pub(crate) fn job_completes(cluster: &Cluster, tag: &str) {
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: lane-job\n  namespace: default\nspec:\n  backoffLimit: 0\n  template:\n    metadata:\n      annotations:\n        crisp.dev/sidecars: \"proxy\"\n    spec:\n      automountServiceAccountToken: false\n      terminationGracePeriodSeconds: 5\n      restartPolicy: Never\n      containers:\n      - name: proxy\n        image: crisp.test/busybox:latest\n        imagePullPolicy: IfNotPresent\n        command: [\"sh\", \"-c\", \"exec sleep 3600\"]\n      - name: app\n        image: crisp.test/busybox:latest\n        imagePullPolicy: IfNotPresent\n        command: [\"sh\", \"-c\", \"sleep 2; echo job done\"]\n";
    let t = Instant::now();
    cluster.apply(job);
    let took = cluster.wait("the Job complete", Duration::from_secs(180), || {
        cluster.jsonpath(&["job", "lane-job"], "{.status.succeeded}") == "1"
    });
    eprintln!(
        "job| {tag}: Job with a legacy sidecar complete {} after apply ({})",
        secs(took),
        secs(t.elapsed())
    );
    let _ = cluster.kubectl(&[
        "delete",
        "job",
        "lane-job",
        "--wait=false",
        "--cascade=background",
    ]);
}

/// crisp SIGKILLed and restarted (in front of `upstream`) while it holds an app's
/// CreateContainer: the pod is still ordered, the tap attached again.
pub(crate) fn restart_mid_hold(
    cluster: &Cluster,
    node: &Node,
    rt: &Runtime,
    tap: &mut Tap,
    upstream: &str,
    tag: &str,
) {
    let hold_secs = 20;
    cluster.apply(&pod(
        "restart-hold",
        "    crisp.dev/sidecars: \"proxy\"\n    crisp.dev/ready.proxy: 'exec:[\"test\",\"-e\",\"/tmp/ready\"]'\n",
        &[],
        &[
            container("app", APP, ""),
            container("proxy", &format!("sleep {hold_secs}; touch /tmp/ready; exec sleep 3600"), ""),
        ],
    ));
    tap.wait_line("the app's hold", Duration::from_secs(120), |l| {
        l["pod_name"] == "restart-hold" && l.get("hold").is_some()
    });
    let kill_at = Instant::now();
    let killed = node_now(node);
    crisp_kill(node);
    crisp_start(node, upstream);
    tap.attach();
    let up = kill_at.elapsed();
    let ran = cluster.wait("restart-hold Ready", Duration::from_secs(180), || {
        cluster.pod_ready("default", "restart-hold")
    });
    let t = rt.pod_times("restart-hold");
    let gap = ms(t["proxy"].started, t["app"].created);
    assert!(
        gap >= (hold_secs * 1000) as f64 - 100.0,
        "after crisp's restart the app was created {gap:.0} ms after the proxy started, before it was ready: {t:?}"
    );
    let restarts = cluster.jsonpath(
        &["pod", "restart-hold"],
        "{range .status.containerStatuses[*]}{.name}={.restartCount} {end}",
    );
    eprintln!(
        "restart| {tag}: crisp killed mid-hold, serving again in {}; pod Ready {} later; proxy started→app created {gap:.0} ms (ready after {hold_secs} s); restartCounts {}",
        secs(up),
        secs(ran),
        restarts.trim()
    );
    if restarts.split_whitespace().any(|c| !c.ends_with("=0")) {
        // A container started again: how its first run ended, and what kubelet and crisp said
        // of the pod from the kill on.
        eprintln!(
            "restart| {tag}: last states {}",
            cluster.jsonpath(
                &["pod", "restart-hold"],
                "{range .status.containerStatuses[*]}{.name}: {.lastState}; {end}",
            )
        );
        for unit in ["kubelet", CRISP_UNIT] {
            for l in journal_since(node, unit, &killed)
                .lines()
                .filter(|l| l.contains("restart-hold") || l.contains("level=error"))
                .take(40)
            {
                eprintln!(
                    "restart| {tag}: {unit}: {}",
                    l.chars().take(400).collect::<String>()
                );
            }
        }
    }
    let _ = cluster.kubectl(&["delete", "pod", "restart-hold", "--wait=false"]);
}

/// Issue #35: a legacy-sidecar pod whose app crisp holds until the sidecar is ready; at the
/// lane's OTLP receiver, kubelet's span of that CreateContainer (service `kubelet`) and crisp's
/// `crisp hold CreateContainer` span with kubelet's trace id and kubelet's span as its parent,
/// inside kubelet's span in time.
pub(crate) fn held_in_kubelets_trace(cluster: &Cluster, spans: &Spans, tag: &str) {
    use crate::support::{hex, span_attr, Exported};
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let s = |e: &Exported, k: &str| match span_attr(&e.span, k) {
        Some(Value::StringValue(v)) => v,
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    cluster.apply(&pod(
        "traced-hold",
        "    crisp.dev/sidecars: \"proxy\"\n    crisp.dev/ready.proxy: 'exec:[\"test\",\"-e\",\"/tmp/ready\"]'\n",
        &[],
        &[container("proxy", &sidecar(None), ""), container("app", APP, "")],
    ));
    cluster.wait("traced-hold Ready", Duration::from_secs(120), || {
        cluster.pod_ready("default", "traced-hold")
    });
    let hold = spans.wait(
        "crisp's hold span of traced-hold's app",
        Duration::from_secs(30),
        |all| {
            all.iter()
                .find(|e| {
                    e.service == "crisp"
                        && e.span.name == "crisp hold CreateContainer"
                        && s(e, "k8s.pod.name") == "traced-hold"
                        && s(e, "k8s.container.name") == "app"
                        && s(e, "crisp.hold.verdict") == "forwarded"
                })
                .cloned()
        },
    );
    let kubelet = spans.wait(
        "kubelet's span of the held CreateContainer",
        Duration::from_secs(30),
        |all| {
            all.iter()
                .find(|e| e.span.span_id == hold.span.parent_span_id)
                .cloned()
        },
    );
    let ms = |a: u64, b: u64| (b as f64 - a as f64) / 1e6;
    let (k, c) = (&kubelet.span, &hold.span);
    eprintln!(
        "trace| {tag}: trace {}; kubelet (service {:?}) span {} {:?} {:.1} ms; crisp (service {:?}) span {} {:?} parent {} {:.1} ms, waited for {:?}, {}; crisp's hold began {:.1} ms after kubelet's span and ended {:.1} ms before it",
        hex(&c.trace_id),
        kubelet.service,
        hex(&k.span_id),
        k.name,
        ms(k.start_time_unix_nano, k.end_time_unix_nano),
        hold.service,
        hex(&c.span_id),
        c.name,
        hex(&c.parent_span_id),
        ms(c.start_time_unix_nano, c.end_time_unix_nano),
        s(&hold, "crisp.hold.waited_for"),
        s(&hold, "crisp.hold.outcome"),
        ms(k.start_time_unix_nano, c.start_time_unix_nano),
        ms(c.end_time_unix_nano, k.end_time_unix_nano),
    );
    assert_eq!(kubelet.service, "kubelet", "{kubelet:?}");
    assert!(k.name.ends_with("CreateContainer"), "kubelet's span: {k:?}");
    assert_eq!(k.trace_id, c.trace_id, "one trace");
    assert_eq!(
        c.parent_span_id, k.span_id,
        "crisp's span is a child of kubelet's"
    );
    let held = ms(c.start_time_unix_nano, c.end_time_unix_nano);
    // The sidecar turns ready READY_AFTER after it starts; kubelet asks for the app a few
    // tens of ms after that start.
    assert!(
        held >= READY_AFTER.as_millis() as f64 - 1000.0,
        "crisp's hold span lasts {held:.1} ms: the app was not held for its sidecar ({READY_AFTER:?})"
    );
    assert!(
        k.start_time_unix_nano <= c.start_time_unix_nano
            && c.end_time_unix_nano <= k.end_time_unix_nano,
        "crisp's hold lies outside kubelet's span: kubelet {k:?}, crisp {c:?}"
    );
    let _ = cluster.kubectl(&["delete", "pod", "traced-hold", "--wait=false"]);
}

/// Tracing: kubelet → recorder A → crisp → recorder B → containerd; every call's trace headers
/// seen at A must be seen at B unchanged.
fn tracing_through_crisp(cluster: &Cluster, node: &Node, minor: u32) {
    crisp_kill(node);
    let relays = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let b = recorder(
        &relays,
        in_node(node, "/run/lane-rec/b.sock"),
        in_node(node, "/run/containerd/containerd.sock"),
    );
    crisp_start(node, "/run/lane-rec/b.sock");
    let a = recorder(
        &relays,
        in_node(node, "/run/lane-rec/a.sock"),
        in_node(node, "/run/crisp/crisp.sock"),
    );
    kubelet_on(cluster, node, "/run/lane-rec/a.sock");
    cluster.apply(&pod("traced", "", &[], &[container("app", APP, "")]));
    let t = Instant::now();
    while !cluster.pod_ready("default", "traced") {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "traced not Running in 120 s behind the two recorders; the pod:\n{}\nkubelet's journal:\n{}\ncrisp's journal:\n{}",
            cluster.kubectl(&["describe", "pod", "traced"]).all(),
            node.journal("kubelet", 60),
            node.journal(CRISP_UNIT, 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = cluster.kubectl(&["delete", "pod", "traced"]);
    let at_a: Vec<Seen> = a.lock().unwrap().clone();
    // What A passed on has reached B a moment later.
    std::thread::sleep(Duration::from_secs(3));
    let at_b: HashSet<Seen> = b.lock().unwrap().iter().cloned().collect();
    let traced: Vec<&Seen> = at_a.iter().filter(|s| !s.1.is_empty()).collect();
    let missing: Vec<&&Seen> = traced.iter().filter(|s| !at_b.contains(**s)).collect();
    let methods: HashSet<&str> = traced
        .iter()
        .map(|s| s.0.rsplit('/').next().unwrap_or(""))
        .collect();
    eprintln!(
        "tracing| 1.{minor}: {} calls at A, {} with traceparent ({} methods, e.g. {:?}); {} of them reached the runtime with other or no trace headers",
        at_a.len(),
        traced.len(),
        methods.len(),
        traced.first(),
        missing.len()
    );
    assert!(
        !traced.is_empty(),
        "kubelet sent no traceparent: tracing not on?"
    );
    assert!(
        traced.iter().any(|s| s.0.ends_with("/CreateContainer")),
        "no traced CreateContainer"
    );
    assert!(
        missing.is_empty(),
        "trace headers changed on the way: {missing:#?}"
    );
}

fn epoch_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The lane's trace recorder itself, without a cluster: a call with trace metadata crosses it to
/// a recording fake runtime with every header, and the recorder keeps the three values.
#[test]
fn the_trace_recorder_relays_calls_and_keeps_their_trace_headers() {
    use crate::support::{Fake, Reply};
    let fake_rt = tokio::runtime::Runtime::new().unwrap();
    let fake = fake_rt.block_on(Fake::start());
    fake.script("/runtime.v1.RuntimeService/Version", |_| {
        Reply::unary(b"\x0a\x02v1")
    });
    let relay_rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("rec.sock");
    let seen = recorder(&relay_rt, sock.clone(), fake.path().to_path_buf());
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let got = fake_rt.block_on(async {
        let mut c = crate::support::runtime_client(&sock).await;
        let mut req = tonic::Request::new(cri::VersionRequest::default());
        req.metadata_mut()
            .insert("traceparent", tp.parse().unwrap());
        req.metadata_mut().insert("baggage", "k=v".parse().unwrap());
        c.version(req)
            .await
            .expect("Version through the recorder")
            .into_inner()
    });
    assert_eq!(got.version, "v1");
    let at_fake = fake.last("/runtime.v1.RuntimeService/Version");
    assert_eq!(at_fake.headers.get("traceparent").unwrap(), tp);
    assert_eq!(at_fake.headers.get("baggage").unwrap(), "k=v");
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![(
            "/runtime.v1.RuntimeService/Version".to_string(),
            tp.to_string(),
            String::new(),
            "k=v".to_string()
        )]
    );
}
