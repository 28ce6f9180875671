//! The engine's rules (DESIGN.md §3–§5) driven through the runtime seam on paused tokio time: a
//! scripted runtime whose containers start, become ready and exit at virtual instants, and the
//! engine's `on_request` called as kubelet calls it. Hold durations are virtual, so they are
//! asserted exactly (within one probe interval) and a 90 s timeout costs no wall time. The
//! end-to-end tests (`e2e/tests/it/ordering.rs`, `pods.rs`, `jobs.rs`) stay the proof on a real
//! runtime.
//!
//! This file is the harness (the scripted runtime, kubelet's calls, assertions); the tests are
//! split like the gates they drive: `start_order.rs` (CreateContainer), `stop_order.rs`
//! (StopContainer, StopPodSandbox), `job_mode.rs`, `probing.rs`, `live_holds.rs`, `read_bound.rs`
//! (the node-wide read bound), `tenant.rs` (hostile pod text), `restarts.rs` (held calls kept
//! across crisp's death, issue #43) and `restores.rs` (restored pods and pods restarted in
//! place, issue #45).

use std::sync::Mutex;

use prost::Message;

use super::*;
use crate::config::Config;
use crate::cri::views::state;
use crate::cri::Route;
use crate::intercept::{Interceptor, Interest, Verdict};
use crate::proxy::client::ClientError;
use crate::status::code;
use runtime::Answer;

pub(crate) const SANDBOX: &str = "sb";
const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn at(t0: Instant, d: Duration) -> Instant {
    t0 + d
}

/// A wall-clock time as the runtime reports it (`created_at`: ns since the epoch).
fn wall_ns(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// One container of the scripted pod: created, started and exited at virtual instants.
struct FakeContainer {
    id: String,
    name: String,
    created: i64,
    started: Option<Instant>,
    exited: Option<Instant>,
    /// An exec readiness probe passes from this instant on.
    ready: Option<Instant>,
}

impl FakeContainer {
    fn state(&self, t: Instant) -> i32 {
        match (self.started, self.exited) {
            (_, Some(e)) if t >= e => state::EXITED,
            (Some(s), _) if t >= s => state::RUNNING,
            _ => state::CREATED,
        }
    }
}

#[derive(Default)]
pub(crate) struct Script {
    annotations: HashMap<String, String>,
    containers: Vec<FakeContainer>,
    /// StopContainer calls crisp made itself: (container name, timeout, when).
    stops: Vec<(String, i64, Instant)>,
    pub(crate) lists: usize,
    /// ExecSync calls crisp made, by container name.
    execs: HashMap<String, usize>,
    /// Every ListContainers answers this late (a runtime under load).
    list_delay: Duration,
    /// The pod IP PodSandboxStatus reports (none: not networked).
    ip: Option<String>,
    /// The annotations every ContainerStatus reports (kubelet's `io.kubernetes.*` stamps).
    status_annotations: HashMap<String, String>,
    /// The node-wide ListContainers fails (the runtime is down).
    down: bool,
    /// The pod's ListContainers fails (no answer within its timeout).
    list_fails: bool,
    /// The runtime handler PodSandboxStatus reports (`""`: the runtime's default).
    handler: String,
    /// The verbose `info` JSON PodSandboxStatus reports (none: not verbose).
    info: Option<String>,
    /// StopPodSandbox calls crisp made itself, when.
    sandbox_stops: Vec<Instant>,
    /// The sandbox is stopped (NOTREADY) from this instant on.
    sandbox_stopped: Option<Instant>,
}

#[derive(Default, Clone)]
pub(crate) struct Fake(Arc<Mutex<Script>>);

impl Fake {
    pub(crate) fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.0.lock().unwrap()
    }

    /// Adds a container, running from `started` (None: created, not started).
    pub(crate) fn add(&self, name: &str, started: Option<Instant>) -> String {
        let mut s = self.script();
        let n = s.containers.len();
        let id = format!("{name}-{n}");
        s.containers.push(FakeContainer {
            id: id.clone(),
            name: name.into(),
            created: wall_ns(std::time::SystemTime::now()) + n as i64,
            started,
            exited: None,
            ready: started,
        });
        id
    }

    /// Container `name` starts now and turns ready `after` that: the start time.
    fn add_ready_after(&self, name: &str, after: Duration) -> Instant {
        let t0 = now();
        self.add(name, Some(t0));
        self.set(name, |c| c.ready = Some(at(t0, after)));
        t0
    }

    /// The StopContainer calls crisp made: (container name, timeout), in order.
    fn stops(&self) -> Vec<(String, i64)> {
        self.script()
            .stops
            .iter()
            .map(|(n, s, _)| (n.clone(), *s))
            .collect()
    }

    fn set(&self, name: &str, f: impl FnOnce(&mut FakeContainer)) {
        let mut s = self.script();
        let c = s
            .containers
            .iter_mut()
            .rev()
            .find(|c| c.name == name)
            .expect("no such container");
        f(c);
    }

    fn view(&self, c: &FakeContainer) -> views::Container {
        views::Container {
            id: c.id.clone(),
            pod_sandbox_id: SANDBOX.into(),
            metadata: Some(views::ContainerMetadata {
                name: c.name.clone(),
                attempt: 0,
            }),
            state: c.state(now()),
            created_at: c.created,
            ..Default::default()
        }
    }
}

fn ready<T: Send + 'static>(v: Result<T, ClientError>) -> Answer<'static, T> {
    Box::pin(async move { v })
}

impl Runtime for Fake {
    fn list_containers<'a>(
        &'a self,
        _: ApiVersion,
        _: &'a str,
    ) -> Answer<'a, Vec<views::Container>> {
        let (delay, fails) = {
            let mut s = self.script();
            s.lists += 1;
            (s.list_delay, s.list_fails)
        };
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if fails {
                return Err(ClientError::Timeout {
                    method: "ListContainers",
                    timeout: 5 * S,
                });
            }
            Ok(self
                .script()
                .containers
                .iter()
                .map(|c| self.view(c))
                .collect())
        })
    }

    fn list_all_containers(&self, _: ApiVersion) -> Answer<'_, Vec<views::Container>> {
        let s = self.script();
        if s.down {
            return ready(Err(ClientError::Timeout {
                method: "ListContainers",
                timeout: 5 * S,
            }));
        }
        ready(Ok(s.containers.iter().map(|c| self.view(c)).collect()))
    }

    fn container<'a>(&'a self, _: ApiVersion, id: &'a str) -> Answer<'a, Option<views::Container>> {
        ready(Ok(self
            .script()
            .containers
            .iter()
            .find(|c| c.id == id)
            .map(|c| self.view(c))))
    }

    fn list_pod_sandboxes(&self, _: ApiVersion) -> Answer<'_, Vec<views::PodSandbox>> {
        ready(Ok(Vec::new()))
    }

    fn pod_sandbox_status<'a>(
        &'a self,
        _: ApiVersion,
        id: &'a str,
    ) -> Answer<'a, views::PodSandboxStatusResponse> {
        let (annotations, ip, runtime_handler, info, stopped) = {
            let s = self.script();
            (
                s.annotations.clone(),
                s.ip.clone(),
                s.handler.clone(),
                s.info.clone(),
                s.sandbox_stopped,
            )
        };
        let status = views::PodSandboxStatus {
            id: id.into(),
            metadata: Some(views::PodSandboxMetadata {
                // The scripted pod is ns/pod; any other sandbox a pod named by its id.
                name: if id == SANDBOX {
                    "pod".into()
                } else {
                    id.into()
                },
                namespace: "ns".into(),
                uid: "uid".into(),
                attempt: 0,
            }),
            annotations,
            network: ip.map(|ip| views::PodSandboxNetworkStatus {
                ip,
                additional_ips: Vec::new(),
            }),
            runtime_handler,
            state: i32::from(stopped.is_some_and(|t| now() >= t)),
            ..Default::default()
        };
        ready(Ok(views::PodSandboxStatusResponse {
            status: Some(status),
            info: info
                .map(|i| [("info".to_string(), i)].into())
                .unwrap_or_default(),
            ..Default::default()
        }))
    }

    fn container_status<'a>(
        &'a self,
        _: ApiVersion,
        id: &'a str,
    ) -> Answer<'a, views::ContainerStatusResponse> {
        let s = self.script();
        let annotations = s.status_annotations.clone();
        // Its exit, on the runtime's wall clock: as long after its creation as it ran.
        let finished_at = s
            .containers
            .iter()
            .find(|c| c.id == id)
            .and_then(|c| {
                let exited = c.exited.filter(|e| now() >= *e)?;
                let ran = exited.saturating_duration_since(c.started.unwrap_or(exited));
                Some(c.created + ran.as_nanos() as i64)
            })
            .unwrap_or(0);
        ready(Ok(views::ContainerStatusResponse {
            status: Some(views::ContainerStatus {
                annotations,
                finished_at,
                ..Default::default()
            }),
        }))
    }

    fn exec_sync<'a>(
        &'a self,
        _: ApiVersion,
        id: &'a str,
        _: &'a [String],
        _: Duration,
    ) -> Answer<'a, i32> {
        let mut s = self.script();
        let c = s
            .containers
            .iter()
            .find(|c| c.id == id)
            .expect("exec in an unknown container");
        let (name, code) = (c.name.clone(), i32::from(c.ready.is_none_or(|r| now() < r)));
        *s.execs.entry(name).or_default() += 1;
        ready(Ok(code))
    }

    fn stop_container<'a>(&'a self, _: ApiVersion, id: &'a str, secs: i64) -> Answer<'a, ()> {
        let mut s = self.script();
        let t = now();
        let c = s
            .containers
            .iter_mut()
            .find(|c| c.id == id)
            .expect("stop of an unknown container");
        c.exited.get_or_insert(t);
        let name = c.name.clone();
        s.stops.push((name, secs, t));
        ready(Ok(()))
    }

    /// Kills whatever still runs (CRI contract) and marks the sandbox NOTREADY.
    fn stop_pod_sandbox<'a>(&'a self, _: ApiVersion, _: &'a str) -> Answer<'a, ()> {
        let mut s = self.script();
        let t = now();
        for c in &mut s.containers {
            c.exited.get_or_insert(t);
        }
        s.sandbox_stops.push(t);
        s.sandbox_stopped.get_or_insert(t);
        ready(Ok(()))
    }
}

/// A pod whose sidecars are judged ready by an exec probe (the fake answers it from `ready`).
/// A fresh fake runtime and an engine over one pod of it (see [`pod`]).
fn fake_pod(sidecars: &[&str], extra: &[(&str, &str)]) -> (Fake, Arc<Engine>) {
    let fake = Fake::default();
    let engine = pod(&fake, sidecars, extra);
    (fake, engine)
}

fn pod(fake: &Fake, sidecars: &[&str], extra: &[(&str, &str)]) -> Arc<Engine> {
    // The rules' tests hold silently; `refuse_held_after` has its own tests below.
    pod_with(fake, sidecars, extra, |c| {
        c.ordering.refuse_held_after = Duration::ZERO
    })
}

/// The result of sidecar `proxy`'s last probe in the test pod (panics when it was never probed).
pub(crate) fn last_probe(engine: &Engine) -> crate::readiness::ProbeResult {
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    p.and_then(|p| p.last_probe("proxy")).unwrap().result
}

/// [`pod`] with the node's config tuned.
pub(crate) fn pod_with(
    fake: &Fake,
    sidecars: &[&str],
    extra: &[(&str, &str)],
    tune: impl FnOnce(&mut Config),
) -> Arc<Engine> {
    pod_on(fake, sidecars, extra, tune, None)
}

/// [`pod_with`] with its marks and intents kept under `state_dir` (`None`: in memory): an
/// engine made again on the same directory is crisp restarted.
fn pod_on(
    fake: &Fake,
    sidecars: &[&str],
    extra: &[(&str, &str)],
    tune: impl FnOnce(&mut Config),
    state_dir: Option<&std::path::Path>,
) -> Arc<Engine> {
    let mut a: HashMap<String, String> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if !sidecars.is_empty() {
        a.insert(annotations::SIDECARS.into(), sidecars.join(","));
    }
    for s in sidecars {
        a.insert(
            format!("{}{s}", annotations::READY_PREFIX),
            r#"exec:["true"]"#.into(),
        );
    }
    fake.script().annotations = a;
    let mut cfg = Config::default();
    cfg.ordering.probe_interval = 100 * MS;
    cfg.ordering.known_injectors = false;
    tune(&mut cfg);
    let state_dir = state_dir.map(|dir| dir.to_path_buf());
    Engine::with_intents(
        &cfg,
        fake.clone(),
        Arc::new(OrderingMetrics::default()),
        Arc::new(job::Terminated::open(state_dir.clone())),
        Arc::new(intents::Intents::open(state_dir)),
    )
}

fn call(rpc: &str, deadline: Option<Duration>) -> Call {
    let path = format!("/runtime.v1.RuntimeService/{rpc}");
    let received = now();
    Call {
        route: Route::from_path(&path),
        path: path.parse().unwrap(),
        received,
        deadline: deadline.map(|d| received + d),
        id: 1,
        trace: None,
    }
}

/// kubelet's CreateContainer: it carries the sandbox config with the pod's annotations.
fn create(fake: &Fake, name: &str) -> Vec<u8> {
    create_in("pod", name, &fake.script().annotations)
}

/// kubelet's CreateContainer of `container` in a pod named `pod` with `annotations`.
fn create_in(pod: &str, container: &str, annotations: &HashMap<String, String>) -> Vec<u8> {
    let sandbox = views::PodSandboxConfig {
        metadata: Some(views::PodSandboxMetadata {
            name: pod.into(),
            namespace: "ns".into(),
            uid: "uid".into(),
            attempt: 0,
        }),
        annotations: annotations.clone(),
        ..Default::default()
    };
    let config = views::ContainerConfig {
        metadata: Some(views::ContainerMetadata {
            name: container.into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    views::CreateContainerRequest {
        pod_sandbox_id: SANDBOX.into(),
        config: Some(config),
        sandbox_config: Some(sandbox),
    }
    .encode_to_vec()
}

fn stop(id: &str, timeout: i64) -> Vec<u8> {
    views::ContainerIdRequest {
        container_id: id.into(),
        timeout,
    }
    .encode_to_vec()
}

/// Runs one call through the engine: its verdict and how long (virtual) it was held.
/// kubelet's CreateContainer of `name` (with its usual deadline) through the engine: the
/// verdict and how long it was held.
async fn create_container(engine: &Engine, fake: &Fake, name: &str) -> (Verdict, Duration) {
    run(
        engine,
        &call("CreateContainer", KUBELET_DEADLINE),
        &create(fake, name),
    )
    .await
}

/// Forwarded without any hold.
fn assert_forwarded_at_once(v: &Verdict, held: Duration) {
    assert_forward(v);
    assert_eq!(held, Duration::ZERO);
}

async fn run(engine: &Engine, call: &Call, msg: &[u8]) -> (Verdict, Duration) {
    let t0 = now();
    let v = engine.on_request(call, msg).await;
    (v, now() - t0)
}

const KUBELET_DEADLINE: Option<Duration> = Some(Duration::from_secs(120));

/// `crisp_hold_seconds_count{gate=...}` as `GET /metrics` shows it.
fn holds(engine: &Engine, gate: &str) -> u64 {
    let mut reg = prometheus_client::registry::Registry::default();
    engine.metrics.register(&mut reg);
    let text = crate::metrics::encode(&reg);
    let key = format!("crisp_hold_seconds_count{{gate=\"{gate}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in\n{text}"))
        .parse()
        .unwrap()
}

/// The refusals counted on the pod (`crisp pods` shows them).
fn pod_refusals(engine: &Engine) -> u64 {
    engine
        .lookup(Some(SANDBOX), None)
        .0
        .unwrap()
        .refusals
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn assert_forward(v: &Verdict) {
    assert!(matches!(v, Verdict::Forward), "expected Forward, got {v:?}");
}

fn refusal(v: &Verdict) -> &str {
    match v {
        Verdict::Refuse(s) => {
            assert_eq!(s.code, code::FAILED_PRECONDITION, "{s:?}");
            &s.message
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn assert_held(held: Duration, expected: Duration, probe_interval: Duration) {
    assert!(
        held >= expected && held <= expected + probe_interval,
        "held {held:?}, expected {expected:?} (+ one probe interval)"
    );
}

// A running pod, for the stop and Job tests

/// A running pod: sidecars and one app, all started at `t0`.
/// A fresh fake runtime and an engine over one running pod of it (see [`running_pod`]).
fn fake_running_pod(sidecars: &[&str]) -> (Fake, Arc<Engine>, Instant) {
    let fake = Fake::default();
    let (engine, t0) = running_pod(&fake, sidecars);
    (fake, engine, t0)
}

fn running_pod(fake: &Fake, sidecars: &[&str]) -> (Arc<Engine>, Instant) {
    let engine = pod(fake, sidecars, &[]);
    let t0 = now();
    for s in sidecars {
        fake.add(s, Some(t0));
    }
    fake.add("app", Some(t0));
    (engine, t0)
}

/// kubelet's StopContainer of `name` with `grace` seconds and `deadline` through the engine: the
/// verdict and how long it was held.
async fn stop_container(
    engine: &Engine,
    fake: &Fake,
    name: &str,
    grace: i64,
    deadline: Option<Duration>,
) -> (Verdict, Duration) {
    run(
        engine,
        &call("StopContainer", deadline),
        &stop(&id_of(fake, name), grace),
    )
    .await
}

fn id_of(fake: &Fake, name: &str) -> String {
    fake.script()
        .containers
        .iter()
        .rev()
        .find(|c| c.name == name)
        .unwrap()
        .id
        .clone()
}

fn forwarded_timeout(v: &Verdict, requested: i64) -> i64 {
    match v {
        Verdict::Forward => requested,
        Verdict::ForwardPatched(b) => {
            views::decode::<views::ContainerIdRequest>(b)
                .unwrap()
                .timeout
        }
        other => panic!("expected the stop to be forwarded, got {other:?}"),
    }
}

mod isolated;
mod job_mode;
mod live_holds;
mod native;
mod probing;
mod read_bound;
mod restarts;
mod restores;
mod start_order;
mod stop_order;
mod tenant;
