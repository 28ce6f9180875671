//! A fast in-process fake CRI runtime for benchmarks: answers every call from canned bytes, so
//! what is measured is the proxy hop, not the runtime. (Integration tests of the forwarder use
//! the scriptable fake in tests/it/support; end-to-end tests use real containerd.)
//!
//! [`serve_via_grpcgo`] puts a grpc-go server (a [`GoBridge`]) in front of it, so a proxy
//! talking to the fake meets containerd's transport: BDP PINGs, PING policing, grpc-go HPACK.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_cri::v1 as cri;
use prost::Message;

use crate::grpcgo::{GoBridge, GoBridgeOpts};
use crate::raw::frame;

/// Canned answers.
pub struct Canned {
    pub version: Bytes,
    pub container_status: Bytes,
    pub list_containers: Bytes,
    /// One sandbox per three containers.
    pub list_sandboxes: Bytes,
    pub sandbox_status: Bytes,
    pub event: Bytes,
    pub events_per_stream: usize,
    /// What kubelet's handshake reads besides Version (and the tap's snapshot of the runtime,
    /// issue #46): Status (runtime and network ready), RuntimeConfig, ImageFsInfo.
    pub status: Bytes,
    pub runtime_config: Bytes,
    pub image_fs_info: Bytes,
    /// Pods created through the fake (a burst of ordered pods, issue #47): answered from their
    /// state; everything else from the canned bytes above.
    pub burst: Option<Arc<Burst>>,
    /// [`Canned::node`]'s pods: PodSandboxStatus answers each of them with its own sandbox (its
    /// annotations, so crisp's recovery finds the Istio sidecar in it); 0 for the other fakes.
    pub node_pods: usize,
    /// Calls answered, by method (the lanes wait on crisp's own calls: its recovery at start).
    pub calls: CallCounts,
}

/// Calls a fake answered, by method name.
#[derive(Default)]
pub struct CallCounts(Mutex<HashMap<String, u64>>);

impl CallCounts {
    fn count(&self, path: &str) {
        let method = path.rsplit('/').next().unwrap_or(path);
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(method.to_string()).or_default() += 1;
    }

    /// How many `method` calls (`ListContainers`, say) were answered so far.
    pub fn get(&self, method: &str) -> u64 {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(method).copied().unwrap_or(0)
    }
}

impl Canned {
    /// `containers`: how many containers ListContainers returns (10,000 → a multi-MiB answer).
    pub fn new(containers: usize, events_per_stream: usize) -> Canned {
        let version = cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1.0".into(),
            runtime_api_version: "v1".into(),
        };
        let status = cri::ContainerStatusResponse {
            status: Some(container_status("c0")),
            info: Default::default(),
        };
        let list = cri::ListContainersResponse {
            containers: (0..containers).map(container).collect(),
        };
        let sandbox = |i: usize| cri::PodSandbox {
            id: format!("{:064x}", i + 1_000_000),
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("pod-{i}"),
                uid: format!("{i:032x}"),
                namespace: "bench".into(),
                attempt: 0,
            }),
            state: 0,
            created_at: 1_700_000_000_000_000_000 + i as i64,
            labels: labels(i * 3),
            ..Default::default()
        };
        let sandboxes = cri::ListPodSandboxResponse {
            items: (0..containers.div_ceil(3)).map(sandbox).collect(),
        };
        let sandbox_status = cri::PodSandboxStatusResponse {
            status: Some(cri::PodSandboxStatus {
                id: format!("{:064x}", 1_000_000),
                metadata: sandbox(0).metadata,
                created_at: 1,
                labels: labels(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        let event = cri::ContainerEventResponse {
            container_id: "c0".into(),
            container_event_type: 1,
            created_at: 1,
            pod_sandbox_status: None,
            containers_statuses: vec![container_status("c0")],
        };
        let runtime_status = cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: ["RuntimeReady", "NetworkReady"]
                    .map(|t| cri::RuntimeCondition {
                        r#type: t.into(),
                        status: true,
                        ..Default::default()
                    })
                    .into(),
            }),
            ..Default::default()
        };
        let runtime_config = cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: cri::CgroupDriver::Systemd.into(),
            }),
        };
        let image_fs_info = cri::ImageFsInfoResponse {
            image_filesystems: vec![cri::FilesystemUsage {
                timestamp: 1_700_000_000_000_000_000,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: "/var/lib/fake/images".into(),
                }),
                used_bytes: Some(cri::UInt64Value { value: 4096 }),
                inodes_used: Some(cri::UInt64Value { value: 2 }),
            }],
            ..Default::default()
        };
        Canned {
            version: frame(&version.encode_to_vec()),
            status: frame(&runtime_status.encode_to_vec()),
            runtime_config: frame(&runtime_config.encode_to_vec()),
            image_fs_info: frame(&image_fs_info.encode_to_vec()),
            container_status: frame(&status.encode_to_vec()),
            list_containers: frame(&list.encode_to_vec()),
            list_sandboxes: frame(&sandboxes.encode_to_vec()),
            sandbox_status: frame(&sandbox_status.encode_to_vec()),
            event: frame(&event.encode_to_vec()),
            events_per_stream,
            burst: None,
            node_pods: 0,
            calls: CallCounts::default(),
        }
    }
}

/// Container names of a node's pods, in the order their containers are numbered: an Istio-shaped
/// pod (an exited init container, the proxy, the app, a log agent), four containers a pod.
const NODE_CONTAINERS: [&str; 4] = ["istio-init", "istio-proxy", "app", "log-agent"];

impl Canned {
    /// A node's lists as kubelet's relist reads them (issue #47): `pods` sandboxes and
    /// `containers` containers (four a pod while they last), each with the fields a kubelet and
    /// a mesh injector put there — 64-hex ids, names, kubelet's labels and annotations (hash,
    /// restart count, ports, termination policy, pre-stop hook), image references by digest —
    /// about 1.5 KB a container and 1.2 KB a sandbox on the wire.
    pub fn node(pods: usize, containers: usize) -> Canned {
        let mut canned = Canned::new(0, 1);
        let list = cri::ListContainersResponse {
            containers: (0..containers).map(node_container).collect(),
        };
        let sandboxes = cri::ListPodSandboxResponse {
            items: (0..pods).map(node_sandbox).collect(),
        };
        canned.list_containers = frame(&list.encode_to_vec());
        canned.list_sandboxes = frame(&sandboxes.encode_to_vec());
        canned.node_pods = pods;
        canned
    }

    /// The PodSandboxStatus of one of [`Canned::node`]'s sandboxes (`msg`: the request), or
    /// `None` for an id that is not one of them.
    fn node_sandbox_status(&self, msg: &[u8]) -> Option<Vec<u8>> {
        let req = cri::PodSandboxStatusRequest::decode(msg).ok()?;
        let pod = usize::from_str_radix(&req.pod_sandbox_id, 16)
            .ok()?
            .checked_sub(1_000_000)
            .filter(|pod| *pod < self.node_pods)?;
        let sandbox = node_sandbox(pod);
        let status = cri::PodSandboxStatus {
            id: sandbox.id,
            metadata: sandbox.metadata,
            state: sandbox.state,
            created_at: sandbox.created_at,
            labels: sandbox.labels,
            annotations: sandbox.annotations,
            ..Default::default()
        };
        Some(
            cri::PodSandboxStatusResponse {
                status: Some(status),
                ..Default::default()
            }
            .encode_to_vec(),
        )
    }
}

fn node_pod_name(pod: usize) -> (String, String) {
    let app = [
        "checkout", "cart", "payments", "catalog", "search", "ledger",
    ][pod % 6];
    (
        format!("{app}-api"),
        format!(
            "{app}-api-7f9c8d6b{:x}-{:05x}",
            pod % 16,
            pod * 7919 % 0xfffff
        ),
    )
}

fn map(pairs: &[(&str, String)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn node_sandbox(pod: usize) -> cri::PodSandbox {
    let (app, name) = node_pod_name(pod);
    let namespace = format!("shop-{}", ["prod", "staging", "batch"][pod % 3]);
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        pod,
        pod % 0xffff,
        pod % 0xfff,
        pod % 0xfff,
        pod
    );
    cri::PodSandbox {
        id: format!("{:064x}", pod + 1_000_000),
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: namespace.clone(),
            attempt: 0,
        }),
        state: 0,
        created_at: 1_700_000_000_000_000_000 + pod as i64,
        labels: map(&[
            ("app", app.clone()),
            ("pod-template-hash", "7f9c8d6b".into()),
            ("io.kubernetes.pod.name", name.clone()),
            ("io.kubernetes.pod.namespace", namespace.clone()),
            ("io.kubernetes.pod.uid", uid.clone()),
            ("security.istio.io/tlsMode", "istio".into()),
            ("service.istio.io/canonical-name", app.clone()),
            ("service.istio.io/canonical-revision", "v1".into()),
        ]),
        annotations: map(&[
            (
                "kubernetes.io/config.seen",
                "2026-11-28T09:14:07.512338104Z".into(),
            ),
            ("kubernetes.io/config.source", "api".into()),
            ("prometheus.io/scrape", "true".into()),
            ("prometheus.io/port", "15020".into()),
            ("prometheus.io/path", "/stats/prometheus".into()),
            ("kubectl.kubernetes.io/default-container", "app".into()),
            (
                "sidecar.istio.io/status",
                "{\"initContainers\":[\"istio-init\"],\"containers\":[\"istio-proxy\"],\
                 \"volumes\":[\"workload-socket\",\"credential-socket\",\"workload-certs\",\
                 \"istio-envoy\",\"istio-data\",\"istio-podinfo\",\"istio-token\",\
                 \"istiod-ca-cert\"],\"imagePullSecrets\":null,\
                 \"revision\":\"default\"}"
                    .into(),
            ),
        ]),
        runtime_handler: String::new(),
    }
}

fn node_container(i: usize) -> cri::Container {
    let (pod, k) = (i / NODE_CONTAINERS.len(), i % NODE_CONTAINERS.len());
    let sandbox = node_sandbox(pod);
    let meta = sandbox.metadata.unwrap_or_default();
    let name = NODE_CONTAINERS[k];
    let (repo, digest) = match name {
        "istio-init" | "istio-proxy" => ("docker.io/istio/proxyv2", 0x1a),
        "log-agent" => ("cr.fluentbit.io/fluent/fluent-bit", 0x2b),
        _ => ("registry.example.com/shop/checkout-api", 0x3c + pod % 6),
    };
    let image = format!("{repo}@sha256:{digest:02x}{:062x}", 0xfeed_u64);
    cri::Container {
        id: format!("{:064x}", i),
        pod_sandbox_id: sandbox.id,
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.clone(),
            user_specified_image: format!("{repo}:1.24.{}", pod % 6),
            ..Default::default()
        }),
        image_ref: image,
        // The init container has exited; the others run.
        state: if k == 0 { 2 } else { 1 },
        created_at: 1_700_000_000_000_000_000 + i as i64,
        labels: map(&[
            ("io.kubernetes.container.name", name.into()),
            ("io.kubernetes.pod.name", meta.name),
            ("io.kubernetes.pod.namespace", meta.namespace),
            ("io.kubernetes.pod.uid", meta.uid),
        ]),
        annotations: map(&[
            ("io.kubernetes.container.hash", format!("{:08x}", i * 2_654_435_761 % (1 << 32))),
            (
                "io.kubernetes.container.hashWithoutResources",
                format!("{:08x}", i * 40_503 % (1 << 32)),
            ),
            ("io.kubernetes.container.restartCount", "0".into()),
            ("io.kubernetes.container.terminationMessagePath", "/dev/termination-log".into()),
            ("io.kubernetes.container.terminationMessagePolicy", "File".into()),
            ("io.kubernetes.pod.terminationGracePeriod", "30".into()),
            (
                "io.kubernetes.container.ports",
                "[{\"name\":\"http\",\"containerPort\":8080,\"protocol\":\"TCP\"},\
                 {\"name\":\"grpc\",\"containerPort\":9090,\"protocol\":\"TCP\"},\
                 {\"name\":\"http-envoy-prom\",\"containerPort\":15090,\"protocol\":\"TCP\"},\
                 {\"name\":\"tcp-health\",\"containerPort\":15021,\"protocol\":\"TCP\"},\
                 {\"name\":\"http-admin\",\"containerPort\":15000,\"protocol\":\"TCP\"}]"
                    .into(),
            ),
            (
                "io.kubernetes.container.preStopHandler",
                "{\"exec\":{\"command\":[\"/bin/sh\",\"-c\",\
                 \"sleep 5 && curl -sf -XPOST http://127.0.0.1:15000/drain_listeners?inboundonly\"]}}"
                    .into(),
            ),
        ]),
        image_id: format!("sha256:{digest:02x}{:062x}", 0xbeef_u64),
    }
}

fn labels(i: usize) -> std::collections::HashMap<String, String> {
    [
        (
            "io.kubernetes.pod.name".to_string(),
            format!("pod-{}", i / 3),
        ),
        (
            "io.kubernetes.pod.namespace".to_string(),
            "bench".to_string(),
        ),
        (
            "io.kubernetes.pod.uid".to_string(),
            format!("{:032x}", i / 3),
        ),
        (
            "io.kubernetes.container.name".to_string(),
            format!("c{}", i % 3),
        ),
    ]
    .into()
}

fn container(i: usize) -> cri::Container {
    cri::Container {
        id: format!("{:064x}", i),
        pod_sandbox_id: format!("{:064x}", i / 3 + 1_000_000),
        metadata: Some(cri::ContainerMetadata {
            name: format!("c{}", i % 3),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
            ..Default::default()
        }),
        image_ref: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        state: 1,
        created_at: 1_700_000_000_000_000_000 + i as i64,
        labels: labels(i),
        annotations: [
            (
                "io.kubernetes.container.hash".to_string(),
                "1a2b3c4d".to_string(),
            ),
            (
                "io.kubernetes.container.restartCount".to_string(),
                "0".to_string(),
            ),
            (
                "io.kubernetes.container.terminationMessagePath".to_string(),
                "/dev/termination-log".to_string(),
            ),
            (
                "io.kubernetes.pod.terminationGracePeriod".to_string(),
                "30".to_string(),
            ),
        ]
        .into(),
        ..Default::default()
    }
}

fn container_status(id: &str) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: id.into(),
        metadata: Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        state: 1,
        created_at: 1,
        started_at: 2,
        image: Some(cri::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        image_ref: "sha256:abc".into(),
        labels: labels(0),
        ..Default::default()
    }
}

/// The runtime side of a burst of ordered pods (issue #47): pods `burst-<i>` created through
/// the fake by RunPodSandbox / CreateContainer / StartContainer, each with a sidecar whose exec
/// readiness probe (ExecSync) the fake answers "not ready" (exit 1) until a known instant and
/// "ready" (exit 0) from then on. It records what the bench measures against: when each pod's
/// sidecar turned ready, when the app's CreateContainer reached the runtime, and every ExecSync.
pub struct Burst {
    /// The sidecar's container name; every other container of a pod is an app.
    sidecar: String,
    /// A sidecar turns ready this long after its StartContainer reached the fake, plus
    /// `spread` × (pod index mod 10) / 10: ready instants that do not all fall in step.
    ready_after: Duration,
    spread: Duration,
    state: Mutex<BurstState>,
}

/// What the fake saw of a burst.
#[derive(Default, Clone)]
pub struct BurstState {
    /// By pod index.
    pub pods: Vec<BurstPod>,
    /// Every ExecSync, when it reached the fake.
    pub execs: Vec<Instant>,
    /// The ExecSyncs answered "not ready" (exit 1), when they reached the fake.
    pub not_ready_execs: Vec<Instant>,
    sandboxes: HashMap<String, usize>,
    containers: HashMap<String, BurstContainer>,
}

/// One pod of a burst, as the fake runtime saw it.
#[derive(Default, Clone, Debug)]
pub struct BurstPod {
    /// From when its probe answers "ready": set by the sidecar's StartContainer.
    pub ready_at: Option<Instant>,
    /// When the app's CreateContainer reached the fake (it left crisp).
    pub app_created: Option<Instant>,
    /// When the fake answered the sidecar's first ExecSync with exit 0: the probe's own success
    /// (issue #47's measure), later than `ready_at` by the wait for a probe turn.
    pub first_success: Option<Instant>,
    /// ExecSync calls before `ready_at`, and from it on.
    pub execs_not_ready: u32,
    pub execs_ready: u32,
}

#[derive(Clone)]
struct BurstContainer {
    id: String,
    sandbox_id: String,
    name: String,
    pod: usize,
    state: i32,
    created_at: i64,
}

impl Burst {
    pub fn new(sidecar: &str, ready_after: Duration, spread: Duration) -> Burst {
        Burst {
            sidecar: sidecar.to_string(),
            ready_after,
            spread,
            state: Mutex::default(),
        }
    }

    /// What the fake saw so far.
    pub fn seen(&self) -> BurstState {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BurstState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer to a call about the burst's pods, or None (the canned answer then): `body`
    /// is the request as it came, one gRPC frame.
    fn answer(&self, path: &str, body: &[u8]) -> Option<Vec<u8>> {
        let msg = body.get(5..)?;
        let method = path.rsplit('/').next()?;
        let now = Instant::now();
        let wall = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64)
        };
        let mut st = self.lock();
        match method {
            "RunPodSandbox" => {
                let req = cri::RunPodSandboxRequest::decode(msg).ok()?;
                let name = req.config?.metadata?.name;
                let pod: usize = name.strip_prefix("burst-")?.parse().ok()?;
                let id = format!("{:064x}", 0xb0_0000 + pod);
                st.sandboxes.insert(id.clone(), pod);
                if st.pods.len() <= pod {
                    st.pods.resize(pod + 1, BurstPod::default());
                }
                Some(cri::RunPodSandboxResponse { pod_sandbox_id: id }.encode_to_vec())
            }
            "CreateContainer" => {
                let req = cri::CreateContainerRequest::decode(msg).ok()?;
                let pod = *st.sandboxes.get(&req.pod_sandbox_id)?;
                let name = req.config?.metadata?.name;
                let sidecar = name == self.sidecar;
                let id = format!("{:064x}", 0xc0_0000 + pod * 2 + usize::from(!sidecar));
                if !sidecar {
                    st.pods[pod].app_created = Some(now);
                }
                let c = BurstContainer {
                    id: id.clone(),
                    sandbox_id: req.pod_sandbox_id,
                    name,
                    pod,
                    state: 0,
                    created_at: wall(),
                };
                st.containers.insert(id.clone(), c);
                Some(cri::CreateContainerResponse { container_id: id }.encode_to_vec())
            }
            "StartContainer" => {
                let req = cri::StartContainerRequest::decode(msg).ok()?;
                let c = st.containers.get_mut(&req.container_id)?;
                c.state = 1;
                let (pod, sidecar) = (c.pod, c.name == self.sidecar);
                if sidecar {
                    let late = self.spread * (pod % 10) as u32 / 10;
                    st.pods[pod].ready_at = Some(now + self.ready_after + late);
                }
                Some(cri::StartContainerResponse {}.encode_to_vec())
            }
            "ExecSync" => {
                let req = cri::ExecSyncRequest::decode(msg).ok()?;
                let pod = st.containers.get(&req.container_id)?.pod;
                let st = &mut *st;
                st.execs.push(now);
                let p = &mut st.pods[pod];
                let ready = p.ready_at.is_some_and(|at| at <= now);
                match ready {
                    true => {
                        p.execs_ready += 1;
                        p.first_success.get_or_insert(now);
                    }
                    false => {
                        p.execs_not_ready += 1;
                        st.not_ready_execs.push(now);
                    }
                }
                Some(
                    cri::ExecSyncResponse {
                        exit_code: i32::from(!ready),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                )
            }
            "ListContainers" | "StreamContainers" => {
                let filter = cri::ListContainersRequest::decode(msg).ok()?.filter?;
                let by_sandbox = !filter.pod_sandbox_id.is_empty();
                if !by_sandbox && filter.id.is_empty() {
                    return None;
                }
                // crisp's own lookups of a burst pod; anything else is not the burst's.
                if (by_sandbox && !st.sandboxes.contains_key(&filter.pod_sandbox_id))
                    || (!by_sandbox && !st.containers.contains_key(&filter.id))
                {
                    return None;
                }
                let mut containers: Vec<cri::Container> = st
                    .containers
                    .values()
                    .filter(|c| match by_sandbox {
                        true => c.sandbox_id == filter.pod_sandbox_id,
                        false => c.id == filter.id,
                    })
                    .map(BurstContainer::listed)
                    .collect();
                containers.sort_by(|a, b| a.id.cmp(&b.id));
                Some(cri::ListContainersResponse { containers }.encode_to_vec())
            }
            "ContainerStatus" => {
                let req = cri::ContainerStatusRequest::decode(msg).ok()?;
                let c = st.containers.get(&req.container_id)?.listed();
                Some(
                    cri::ContainerStatusResponse {
                        status: Some(cri::ContainerStatus {
                            id: c.id,
                            metadata: c.metadata,
                            state: c.state,
                            created_at: c.created_at,
                            started_at: c.created_at,
                            labels: c.labels,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                )
            }
            "PodSandboxStatus" => {
                let req = cri::PodSandboxStatusRequest::decode(msg).ok()?;
                let pod = *st.sandboxes.get(&req.pod_sandbox_id)?;
                Some(
                    cri::PodSandboxStatusResponse {
                        status: Some(cri::PodSandboxStatus {
                            id: req.pod_sandbox_id,
                            metadata: Some(cri::PodSandboxMetadata {
                                name: format!("burst-{pod}"),
                                uid: format!("{pod:032x}"),
                                namespace: "burst".into(),
                                attempt: 0,
                            }),
                            created_at: 1,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                )
            }
            _ => None,
        }
    }
}

impl BurstContainer {
    fn listed(&self) -> cri::Container {
        cri::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: Some(cri::ContainerMetadata {
                name: self.name.clone(),
                attempt: 0,
            }),
            state: self.state,
            created_at: self.created_at,
            labels: map(&[
                ("io.kubernetes.container.name", self.name.clone()),
                ("io.kubernetes.pod.name", format!("burst-{}", self.pod)),
                ("io.kubernetes.pod.namespace", "burst".into()),
            ]),
            ..Default::default()
        }
    }
}

/// A gRPC response body: some data frames, then `grpc-status: 0` trailers.
pub struct CannedBody {
    frames: Vec<Bytes>,
    next: usize,
    trailers_sent: bool,
}

impl http_body::Body for CannedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.next < self.frames.len() {
            let f = self.frames[self.next].clone();
            self.next += 1;
            return Poll::Ready(Some(Ok(Frame::data(f))));
        }
        if !self.trailers_sent {
            self.trailers_sent = true;
            let mut t = HeaderMap::new();
            t.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        Poll::Ready(None)
    }
}

async fn answer(
    canned: Arc<Canned>,
    req: Request<Incoming>,
) -> Result<Response<CannedBody>, Infallible> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_string();
    canned.calls.count(&path);
    // Read the request fully, as a real runtime would.
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // A List with a filter (crisp's own lookups by sandbox or id) matches nothing here, as it
    // would match a handful on a real node, not the whole canned list.
    let filtered = body.len() > 5;
    // StreamContainers (KEP-5825) is served as one chunk: the list.
    let containers = path.ends_with("/ListContainers") || path.ends_with("/StreamContainers");
    let frames = if filtered && (containers || path.ends_with("/ListPodSandbox")) {
        vec![frame(&[])]
    } else if containers {
        vec![canned.list_containers.clone()]
    } else if path.ends_with("/ContainerStatus") {
        vec![canned.container_status.clone()]
    } else if path.ends_with("/ListPodSandbox") {
        vec![canned.list_sandboxes.clone()]
    } else if path.ends_with("/PodSandboxStatus") {
        let own = (canned.node_pods > 0)
            .then(|| canned.node_sandbox_status(body.get(5..).unwrap_or_default()))
            .flatten();
        vec![own.map_or_else(|| canned.sandbox_status.clone(), |m| frame(&m))]
    } else if path.ends_with("/GetContainerEvents") {
        vec![canned.event.clone(); canned.events_per_stream]
    } else if path.ends_with(".RuntimeService/Status") {
        vec![canned.status.clone()]
    } else if path.ends_with("/RuntimeConfig") {
        vec![canned.runtime_config.clone()]
    } else if path.ends_with("/ImageFsInfo") {
        vec![canned.image_fs_info.clone()]
    } else {
        vec![canned.version.clone()]
    };
    let frames = match canned.burst.as_ref().and_then(|b| b.answer(&path, &body)) {
        Some(message) => vec![frame(&message)],
        None => frames,
    };
    let mut resp = Response::new(CannedBody {
        frames,
        next: 0,
        trailers_sent: false,
    });
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    Ok(resp)
}

/// Serves the fake runtime on `socket` until the returned handle is dropped.
pub struct FakeRuntime {
    /// Where clients connect: the fake itself, or its grpc-go front ([`serve_via_grpcgo`]).
    pub socket: PathBuf,
    /// The grpc-go server in front of the fake, if any (dropped before the fake).
    pub bridge: Option<GoBridge>,
    /// The fake's own socket (= `socket` without a bridge).
    pub fake_socket: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        self.bridge.take();
        self.task.abort();
        let _ = std::fs::remove_file(&self.fake_socket);
    }
}

/// Like [`serve`], but clients on `socket` reach the fake through a grpc-go server (a
/// `crisp-grpcgo bridge` with grpc-go's default keep-alive enforcement, as containerd runs
/// it); the fake itself listens on `<socket>.fake`. Must be called inside a tokio runtime.
///
/// The bridge's own client leg to the fake sends `:authority: localhost` unless `opts` says
/// otherwise: the fake is a hyper server, which rejects grpc-go's default (the socket path).
pub fn serve_via_grpcgo(
    socket: &Path,
    canned: Arc<Canned>,
    mut opts: GoBridgeOpts,
) -> anyhow::Result<FakeRuntime> {
    opts.authority
        .get_or_insert_with(|| "localhost".to_string());
    let mut name = socket.as_os_str().to_owned();
    name.push(".fake");
    let fake_socket = PathBuf::from(name);
    let mut rt = serve(&fake_socket, canned)?;
    rt.bridge = Some(GoBridge::start(socket, &fake_socket, opts)?);
    rt.socket = socket.to_path_buf();
    Ok(rt)
}

pub fn serve(socket: &Path, canned: Arc<Canned>) -> std::io::Result<FakeRuntime> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)?;
    let task = tokio::spawn(async move {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .max_concurrent_streams(4096)
            .initial_stream_window_size(2 << 20)
            .initial_connection_window_size(16 << 20)
            .max_frame_size(1 << 20);
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let canned = canned.clone();
            let conn = builder.serve_connection(
                TokioIo::new(s),
                hyper::service::service_fn(move |r| answer(canned.clone(), r)),
            );
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    Ok(FakeRuntime {
        socket: socket.to_path_buf(),
        bridge: None,
        fake_socket: socket.to_path_buf(),
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relist lane's answers are the size issue #47 names (about 1.5 KB a container, 15 MB
    /// for 10,000) and stay under kubelet's 16 MiB receive limit.
    #[test]
    fn a_node_list_is_about_1_5_kb_a_container_and_fits_kubelet_s_limit() {
        let c = Canned::node(2_500, 10_000);
        let per = c.list_containers.len() / 10_000;
        assert!((1_300..=1_650).contains(&per), "{per} B a container");
        assert!(c.list_containers.len() - 5 < 16 << 20);
        let s = Canned::node(500, 2_000);
        assert_eq!(
            cri::ListPodSandboxResponse::decode(&s.list_sandboxes[5..])
                .unwrap()
                .items
                .len(),
            500
        );
    }

    /// A node's PodSandboxStatus answers each sandbox with its own metadata and annotations
    /// (crisp's recovery reads them), and anything else with the canned status.
    #[test]
    fn a_node_answers_the_status_of_each_of_its_sandboxes() {
        let c = Canned::node(10, 40);
        let ask = |id: String| {
            let req = cri::PodSandboxStatusRequest {
                pod_sandbox_id: id,
                verbose: false,
            };
            c.node_sandbox_status(&req.encode_to_vec())
                .map(|m| cri::PodSandboxStatusResponse::decode(&m[..]).unwrap())
        };
        let status = ask(format!("{:064x}", 1_000_007)).unwrap().status.unwrap();
        assert_eq!(status.id, format!("{:064x}", 1_000_007));
        assert_eq!(status.metadata.unwrap().name, node_pod_name(7).1);
        assert!(status.annotations.contains_key("sidecar.istio.io/status"));
        assert!(
            ask(format!("{:064x}", 1_000_010)).is_none(),
            "not one of its 10"
        );
        assert!(ask("nope".into()).is_none());
    }

    /// The burst's runtime: a pod created through it answers its sidecar's exec probe "not
    /// ready" until the known instant and "ready" from then on, lists the pod's containers to
    /// crisp's filtered lookups, and records the app's create.
    #[test]
    fn a_burst_pod_turns_ready_at_its_instant_and_records_its_app() {
        let b = &Burst::new("proxy", Duration::from_millis(30), Duration::ZERO);
        let call = |m: &str, msg: &dyn Fn() -> Vec<u8>| {
            let answer = b.answer(&format!("/runtime.v1.RuntimeService/{m}"), &frame(&msg()));
            answer.unwrap_or_else(|| panic!("{m} not answered"))
        };
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "burst-3".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let run = || {
            cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let sandbox = cri::RunPodSandboxResponse::decode(&call("RunPodSandbox", &run)[..])
            .unwrap()
            .pod_sandbox_id;
        let create = |name: &'static str| {
            let sandbox = sandbox.clone();
            move || {
                cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox.clone(),
                    config: Some(cri::ContainerConfig {
                        metadata: Some(cri::ContainerMetadata {
                            name: name.into(),
                            attempt: 0,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
                .encode_to_vec()
            }
        };
        let sidecar =
            cri::CreateContainerResponse::decode(&call("CreateContainer", &create("proxy"))[..])
                .unwrap()
                .container_id;
        let id = sidecar.clone();
        call("StartContainer", &move || {
            cri::StartContainerRequest {
                container_id: id.clone(),
            }
            .encode_to_vec()
        });
        let id = sidecar.clone();
        let exec = move || {
            let req = cri::ExecSyncRequest {
                container_id: id.clone(),
                ..Default::default()
            };
            let answer = b.answer(
                "/runtime.v1.RuntimeService/ExecSync",
                &frame(&req.encode_to_vec()),
            );
            cri::ExecSyncResponse::decode(&answer.unwrap()[..])
                .unwrap()
                .exit_code
        };
        assert_eq!(exec(), 1, "not ready before its instant");
        let listed = call("ListContainers", &|| {
            cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: sandbox.clone(),
                    ..Default::default()
                }),
            }
            .encode_to_vec()
        });
        let listed = cri::ListContainersResponse::decode(&listed[..])
            .unwrap()
            .containers;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].state, 1, "the started sidecar runs");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(exec(), 0, "ready from its instant on");
        call("CreateContainer", &create("app"));
        let seen = b.seen();
        let pod = &seen.pods[3];
        assert!(pod.app_created.unwrap() > pod.ready_at.unwrap());
        let success = pod.first_success.expect("the ready answer is recorded");
        assert!(success >= pod.ready_at.unwrap() && success <= pod.app_created.unwrap());
        assert_eq!(exec(), 0);
        assert_eq!(
            b.seen().pods[3].first_success,
            Some(success),
            "the first, not the last"
        );
        let seen = b.seen();
        let pod = &seen.pods[3];
        assert_eq!((pod.execs_not_ready, pod.execs_ready), (1, 2));
        assert_eq!(seen.execs.len(), 3);
        assert_eq!(seen.not_ready_execs, seen.execs[..1]);
        // The relist's unfiltered list is the canned node's, not the burst's.
        let all = cri::ListContainersRequest::default().encode_to_vec();
        assert!(b
            .answer("/runtime.v1.RuntimeService/ListContainers", &frame(&all))
            .is_none());
    }
}
