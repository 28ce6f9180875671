//! The engine's rules (DESIGN.md §3–§4) driven through the runtime seam on paused tokio time: a
//! scripted runtime whose containers start, become ready and exit at virtual instants, and the
//! engine's `on_request` called as kubelet calls it. Hold durations are virtual, so they are
//! asserted exactly (within one probe interval) and a 90 s timeout costs no wall time. The
//! end-to-end tests (`e2e/tests/it/ordering.rs`, `pods.rs`, `jobs.rs`) stay the proof on a real
//! runtime.

use prost::Message;

use super::*;
use crate::config::Config;
use crate::cri::Route;
use crate::proxy::client::ClientError;
use runtime::Answer;

const SANDBOX: &str = "sb";
const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn at(t0: Instant, d: Duration) -> Instant {
    t0 + d
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
struct Script {
    annotations: HashMap<String, String>,
    containers: Vec<FakeContainer>,
    /// StopContainer calls crisp made itself: (container name, timeout, when).
    stops: Vec<(String, i64, Instant)>,
    lists: usize,
    /// Every ListContainers answers this late (a runtime under load).
    list_delay: Duration,
    /// The pod IP PodSandboxStatus reports (none: not networked).
    ip: Option<String>,
    /// The annotations every ContainerStatus reports (kubelet's `io.kubernetes.*` stamps).
    status_annotations: HashMap<String, String>,
}

#[derive(Default, Clone)]
struct Fake(Arc<Mutex<Script>>);

impl Fake {
    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.0.lock().unwrap()
    }

    /// Adds a container, running from `started` (None: created, not started).
    fn add(&self, name: &str, started: Option<Instant>) -> String {
        let mut s = self.script();
        let n = s.containers.len();
        let id = format!("{name}-{n}");
        s.containers.push(FakeContainer {
            id: id.clone(),
            name: name.into(),
            created: n as i64 + 1,
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
        let delay = {
            let mut s = self.script();
            s.lists += 1;
            s.list_delay
        };
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(self
                .script()
                .containers
                .iter()
                .map(|c| self.view(c))
                .collect())
        })
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
        let (annotations, ip) = {
            let s = self.script();
            (s.annotations.clone(), s.ip.clone())
        };
        let status = views::PodSandboxStatus {
            id: id.into(),
            metadata: Some(views::PodSandboxMetadata {
                name: "pod".into(),
                namespace: "ns".into(),
                uid: "uid".into(),
                attempt: 0,
            }),
            annotations,
            network: ip.map(|ip| views::PodSandboxNetworkStatus {
                ip,
                additional_ips: Vec::new(),
            }),
            ..Default::default()
        };
        ready(Ok(views::PodSandboxStatusResponse {
            status: Some(status),
            ..Default::default()
        }))
    }

    fn container_status<'a>(
        &'a self,
        _: ApiVersion,
        _: &'a str,
    ) -> Answer<'a, views::ContainerStatusResponse> {
        let annotations = self.script().status_annotations.clone();
        ready(Ok(views::ContainerStatusResponse {
            status: Some(views::ContainerStatus {
                annotations,
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
        let s = self.script();
        let c = s
            .containers
            .iter()
            .find(|c| c.id == id)
            .expect("exec in an unknown container");
        ready(Ok(if c.ready.is_some_and(|r| now() >= r) {
            0
        } else {
            1
        }))
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

/// [`pod`] with the node's config tuned.
fn pod_with(
    fake: &Fake,
    sidecars: &[&str],
    extra: &[(&str, &str)],
    tune: impl FnOnce(&mut Config),
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
    Engine::new(
        &cfg,
        fake.clone(),
        Arc::new(OrderingMetrics::default()),
        Arc::new(job::Terminated::open(None)),
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
    }
}

/// kubelet's CreateContainer: it carries the sandbox config with the pod's annotations.
fn create(fake: &Fake, name: &str) -> Vec<u8> {
    let sandbox = views::PodSandboxConfig {
        metadata: Some(views::PodSandboxMetadata {
            name: "pod".into(),
            namespace: "ns".into(),
            uid: "uid".into(),
            attempt: 0,
        }),
        annotations: fake.script().annotations.clone(),
        ..Default::default()
    };
    let config = views::ContainerConfig {
        metadata: Some(views::ContainerMetadata {
            name: name.into(),
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

fn assert_forward(v: &Verdict) {
    assert!(matches!(v, Verdict::Forward), "expected Forward, got {v:?}");
}

fn refusal(v: &Verdict) -> &str {
    match v {
        Verdict::Reject(s) => {
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

// ---------------------------------------------------------------------------------------------
// §3 start order

#[tokio::test(start_paused = true)]
async fn pod_without_sidecars_is_never_held_nor_looked_up() {
    let (fake, engine) = fake_pod(&[], &[]);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
    assert_eq!(
        fake.script().lists,
        0,
        "no runtime call for a pod without sidecars"
    );
}

#[tokio::test(start_paused = true)]
async fn list_and_status_calls_are_never_observed() {
    let (_fake, engine) = fake_pod(&["proxy"], &[]);
    for rpc in [
        "ListContainers",
        "ListPodSandbox",
        "ContainerStatus",
        "PodSandboxStatus",
        "ListContainerStats",
        "Status",
        "Version",
        "ImageStatus",
        "ListImages",
    ] {
        assert!(
            engine.interest(&call(rpc, None)).is_none(),
            "{rpc} must take the fast path"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn app_is_forwarded_at_once_when_every_sidecar_is_ready() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn app_is_held_until_its_sidecar_is_ready() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add_ready_after("proxy", 4 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, 4 * S, 100 * MS);
    assert_eq!(holds(&engine, "start"), 1);
    assert_eq!(engine.metrics.holds_in_flight.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn sidecars_gate_each_other_in_declared_order() {
    let (fake, engine) = fake_pod(&["first", "second"], &[]);
    fake.add_ready_after("first", 3 * S);
    // The first sidecar waits for nobody.
    let (v, held) = create_container(&engine, &fake, "first").await;
    assert_forwarded_at_once(&v, held);
    // The second waits for the first.
    let (v, held) = create_container(&engine, &fake, "second").await;
    assert_forward(&v);
    assert_held(held, 3 * S, 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn app_listed_before_its_sidecar_is_refused_at_once() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let (v, held) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v);
    assert!(
        msg.contains("\"proxy\"")
            && msg.contains("not created yet")
            && msg.contains("network is not ready"),
        "{msg}"
    );
    assert_eq!(
        held,
        Duration::ZERO,
        "refused, not held: holding would deadlock kubelet's sync loop"
    );
    assert_eq!(engine.metrics.fail_fast.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn app_is_refused_while_its_sidecar_is_created_but_not_running() {
    for (what, started, exited) in [
        ("created but not started", None, None),
        ("exited", Some(Duration::ZERO), Some(Duration::ZERO)),
    ] {
        let (fake, engine) = fake_pod(&["proxy"], &[]);
        let t0 = now();
        fake.add("proxy", started.map(|d| at(t0, d)));
        fake.set("proxy", |c| c.exited = exited.map(|d| at(t0, d)));
        let (v, held) = create_container(&engine, &fake, "app").await;
        let msg = refusal(&v);
        assert!(msg.contains(what), "{msg}");
        assert_eq!(held, Duration::ZERO);
    }
}

#[tokio::test(start_paused = true)]
async fn hold_ends_at_the_start_timeout_under_proceed() {
    let (fake, engine) = fake_pod(&["proxy"], &[(annotations::START_TIMEOUT, "10s")]);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_eq!(held, 10 * S);
    assert_eq!(engine.metrics.start_hold_timeouts.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn hold_ends_at_the_start_timeout_under_fail() {
    let (fake, engine) = fake_pod(
        &["proxy"],
        &[
            (annotations::START_TIMEOUT, "10s"),
            (annotations::TIMEOUT_POLICY, "fail"),
        ],
    );
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let (v, held) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v);
    assert!(msg.contains("not ready within 10s"), "{msg}");
    assert_eq!(held, 10 * S);
}

#[tokio::test(start_paused = true)]
async fn hold_never_outlives_kubelets_deadline() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    // Start timeout 90 s (default); kubelet's deadline 8 s: the hold ends 3 s before it.
    let (v, held) = run(
        &engine,
        &call("CreateContainer", Some(8 * S)),
        &create(&fake, "app"),
    )
    .await;
    assert_forward(&v);
    assert_eq!(held, 8 * S - decide::DEADLINE_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_hold_forwards_nothing_and_leaves_no_gauge() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    // kubelet gives up after 2 s (the proxy drops the future: drop = cancel).
    let c = call("CreateContainer", KUBELET_DEADLINE);
    let msg = create(&fake, "app");
    let r = tokio::time::timeout(2 * S, engine.on_request(&c, &msg)).await;
    assert!(r.is_err(), "still held when kubelet gave up");
    assert_eq!(
        engine.metrics.holds_in_flight.get(),
        0,
        "the held-calls gauge counts the abandoned hold out"
    );
}

/// A pod whose sidecar `proxy` was created and has exited.
fn dead_proxy_pod(extra: &[(&str, &str)]) -> (Fake, Arc<Engine>) {
    let (fake, engine) = fake_pod(&["proxy"], extra);
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.exited = Some(t0));
    (fake, engine)
}

#[tokio::test(start_paused = true)]
async fn refusals_for_a_dead_sidecar_end_at_the_start_timeout_under_proceed() {
    let (fake, engine) = dead_proxy_pod(&[(annotations::START_TIMEOUT, "10s")]);
    refusal(&create_container(&engine, &fake, "app").await.0);
    // kubelet retries every ~1 s; refused until 10 s after the first refusal, then let through.
    tokio::time::sleep(9 * S).await;
    refusal(&create_container(&engine, &fake, "app").await.0);
    tokio::time::sleep(S).await;
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn refusals_for_a_dead_sidecar_go_on_under_fail() {
    let (fake, engine) = dead_proxy_pod(&[
        (annotations::START_TIMEOUT, "10s"),
        (annotations::TIMEOUT_POLICY, "fail"),
    ]);
    refusal(&create_container(&engine, &fake, "app").await.0);
    tokio::time::sleep(20 * S).await;
    refusal(&create_container(&engine, &fake, "app").await.0);
}

#[tokio::test(start_paused = true)]
async fn known_init_container_is_never_held() {
    let (fake, engine) = fake_pod(&["proxy"], &[(annotations::INIT_CONTAINERS, "setup")]);
    let (v, held) = create_container(&engine, &fake, "setup").await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn unnamed_init_container_is_let_through_when_kubelet_comes_straight_back() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    // No sidecar exists and nothing names "setup": refused once...
    refusal(&create_container(&engine, &fake, "setup").await.0);
    // ...and kubelet's next call for the pod is the same container again, ~1 s later: init.
    tokio::time::sleep(S).await;
    let (v, _) = create_container(&engine, &fake, "setup").await;
    assert_forward(&v);
}

#[tokio::test(start_paused = true)]
async fn unnamed_regular_container_stays_refused_when_kubelet_moves_on() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    refusal(&create_container(&engine, &fake, "app").await.0);
    // kubelet goes on to the next container in the same loop: the sidecar's CreateContainer.
    let (v, _) = create_container(&engine, &fake, "proxy").await;
    assert_forward(&v);
    // Its creation failed (nothing in the runtime); the app's retry is refused again.
    tokio::time::sleep(S).await;
    refusal(&create_container(&engine, &fake, "app").await.0);
}

// ---------------------------------------------------------------------------------------------
// §4 stop order

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

#[tokio::test(start_paused = true)]
async fn app_stop_is_forwarded_at_once() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    let (v, held) = stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE).await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn sidecar_stop_is_held_until_the_apps_exit_and_gets_what_is_left_of_the_budget() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    // kubelet kills in parallel: the app's stop, then the sidecar's, same grace.
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 3 * S)));
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_held(held, 3 * S, 100 * MS);
    let secs = forwarded_timeout(&v, 30);
    assert_eq!(
        secs, 27,
        "one budget for the pod: 30 s from the first stop, 3 s of it spent"
    );
    assert_eq!(holds(&engine, "stop"), 1);
}

#[tokio::test(start_paused = true)]
async fn sidecar_stop_gets_the_2s_tail_once_the_budget_is_spent() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 5, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 9 * S)));
    let (v, held) = stop_container(&engine, &fake, "proxy", 5, Some(5 * S + 120 * S)).await;
    assert_held(held, 9 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 5), 2);
}

#[tokio::test(start_paused = true)]
async fn sidecars_stop_in_reverse_declared_order() {
    let (fake, engine, t0) = fake_running_pod(&["first", "second"]);
    fake.set("app", |c| c.exited = Some(t0));
    fake.set("second", |c| c.exited = Some(at(t0, 2 * S)));
    // "first" outlives "second".
    let (v, held) = stop_container(&engine, &fake, "first", 30, KUBELET_DEADLINE).await;
    assert_held(held, 2 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 30), 28);
}

#[tokio::test(start_paused = true)]
async fn a_single_sidecar_kill_is_forwarded_after_its_grace() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    // Liveness kill of the sidecar alone: no app is being stopped; the app keeps running.
    let (v, held) = stop_container(&engine, &fake, "proxy", 5, KUBELET_DEADLINE).await;
    assert_held(held, 5 * S, 100 * MS);
    assert_eq!(
        forwarded_timeout(&v, 5),
        2,
        "its grace is spent: the KEP's 2 s tail"
    );
}

/// The app's stop is forwarded and the app never exits; kubelet's deadline for the sidecar's
/// 30 s stop is 20 s away and every ListContainers takes `list_delay`: the sidecar's stop is
/// still held only until just before that deadline, with 15 s of its budget left.
async fn assert_sidecar_stop_ends_before_kubelets_deadline(list_delay: Duration) {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.script().list_delay = list_delay;
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, Some(20 * S)).await;
    assert_eq!(
        held,
        20 * S - decide::DEADLINE_MARGIN - decide::STOP_TAIL,
        "list delay {list_delay:?}"
    );
    assert_eq!(
        forwarded_timeout(&v, 30),
        15,
        "15 s of the 30 s budget left"
    );
}

#[tokio::test(start_paused = true)]
async fn sidecar_stop_hold_ends_before_kubelets_deadline() {
    assert_sidecar_stop_ends_before_kubelets_deadline(Duration::ZERO).await;
}

/// The hold ends on time even while the runtime has not answered.
#[tokio::test(start_paused = true)]
async fn a_slow_runtime_never_stretches_a_sidecar_stop_past_kubelets_deadline() {
    assert_sidecar_stop_ends_before_kubelets_deadline(30 * S).await;
}

#[tokio::test(start_paused = true)]
async fn a_repeated_sidecar_stop_shares_the_budget() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 4 * S)));
    let first = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    tokio::time::sleep(S).await;
    let again = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_eq!(forwarded_timeout(&first.0, 30), 26);
    assert_eq!(again.1, Duration::ZERO, "nothing left to wait for");
    assert_eq!(
        forwarded_timeout(&again.0, 30),
        25,
        "the same window, one second later"
    );
}

#[tokio::test(start_paused = true)]
async fn stop_pod_sandbox_waits_for_the_apps_then_stops_sidecars_in_reverse() {
    let (fake, engine, t0) = fake_running_pod(&["first", "second"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 2 * S)));
    let msg = views::PodSandboxIdRequest {
        pod_sandbox_id: SANDBOX.into(),
    }
    .encode_to_vec();
    let (v, held) = run(&engine, &call("StopPodSandbox", KUBELET_DEADLINE), &msg).await;
    assert_forward(&v);
    assert_held(held, 2 * S, 100 * MS);
    let stops: Vec<(String, i64)> = fake
        .script()
        .stops
        .iter()
        .map(|(n, s, _)| (n.clone(), *s))
        .collect();
    assert_eq!(
        stops,
        vec![("second".to_string(), 28), ("first".to_string(), 28)],
        "reverse order, with what is left of the budget"
    );
}

/// kubelet's StopContainer for the app never came (its own deadline for a grace period near
/// 2^63 s wraps below zero and the call expires unsent), then StopPodSandbox: when the hold
/// ends, crisp stops the app first, then the sidecars in reverse order.
#[tokio::test(start_paused = true)]
async fn stop_pod_sandbox_stops_an_app_kubelet_never_stopped_before_the_sidecars() {
    let (fake, engine, _) = fake_running_pod(&["first", "second"]);
    let msg = views::PodSandboxIdRequest {
        pod_sandbox_id: SANDBOX.into(),
    }
    .encode_to_vec();
    let (v, _) = run(&engine, &call("StopPodSandbox", KUBELET_DEADLINE), &msg).await;
    assert_forward(&v);
    let stops: Vec<String> = fake
        .script()
        .stops
        .iter()
        .map(|(n, _, _)| n.clone())
        .collect();
    assert_eq!(
        stops,
        ["app", "second", "first"],
        "the app before the sidecars, which stop in reverse"
    );
    assert_eq!(fake.script().stops[0].1, decide::STOP_TAIL.as_secs() as i64);
}

// ---------------------------------------------------------------------------------------------
// Issue #26: tenant numbers

/// A pod's terminationGracePeriodSeconds near 2^63 reaches crisp as StopContainer's `timeout`
/// (kubelet's own deadline wraps to an ordinary one, so the call does arrive): the sidecar's
/// stop is still held only while the app runs, then forwarded with at most a day's budget.
#[tokio::test(start_paused = true)]
async fn a_stop_with_an_extreme_grace_period_completes_in_order() {
    for (grace, deadline) in [
        (i64::MAX, Some(60 * S)),
        (i64::MAX, None),
        (i64::MAX - 1, KUBELET_DEADLINE),
    ] {
        let (fake, engine, t0) = fake_running_pod(&["proxy"]);
        let (v, held) = stop_container(&engine, &fake, "app", grace, deadline).await;
        assert_forwarded_at_once(&v, held);
        fake.set("app", |c| c.exited = Some(at(t0, 3 * S)));
        let (v, held) = stop_container(&engine, &fake, "proxy", grace, deadline).await;
        assert_held(held, 3 * S, 100 * MS);
        assert_eq!(
            forwarded_timeout(&v, grace),
            86_397,
            "{grace} {deadline:?}: a day's budget, 3 s of it spent"
        );
    }
}

/// The same with the app never exiting: the hold ends before kubelet's (wrapped) deadline.
#[tokio::test(start_paused = true)]
async fn a_stop_with_an_extreme_grace_period_still_ends_before_kubelets_deadline() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", i64::MAX, Some(60 * S))
            .await
            .0,
    );
    let (v, held) = stop_container(&engine, &fake, "proxy", i64::MAX, Some(60 * S)).await;
    assert_eq!(held, 60 * S - decide::DEADLINE_MARGIN - decide::STOP_TAIL);
    assert_eq!(forwarded_timeout(&v, i64::MAX), 86_400 - 55);
    // A negative timeout (no grace at all) panics nothing either.
    let (v, _) = stop_container(&engine, &fake, "proxy", i64::MIN, Some(60 * S)).await;
    assert_forward(&v);
}

/// Job mode reads the grace period from the sidecar's `io.kubernetes.pod.terminationGracePeriod`:
/// any int64 (or more) stops the sidecar with at most a day's timeout, no panic.
#[tokio::test(start_paused = true)]
async fn a_job_sidecar_with_an_extreme_grace_annotation_is_stopped() {
    for grace in [
        "9223372036854775807",
        "9223372036854775806",
        "18446744073709551615",
    ] {
        let (fake, engine, _) = fake_running_pod(&["proxy"]);
        fake.script().status_annotations = [(
            "io.kubernetes.pod.terminationGracePeriod".to_string(),
            grace.to_string(),
        )]
        .into();
        let pod = engine.pod_by_id(ApiVersion::V1, SANDBOX).await.unwrap();
        engine.terminate_sidecars(ApiVersion::V1, &pod).await;
        let stops: Vec<(String, i64)> = fake
            .script()
            .stops
            .iter()
            .map(|(n, s, _)| (n.clone(), *s))
            .collect();
        assert_eq!(stops, vec![("proxy".to_string(), 86_400)], "{grace}");
    }
}

/// Issue #26: held calls re-read the runtime under one node-wide bound. 40 CreateContainers
/// held on a never-ready sidecar and 40 sidecar StopContainers held on a running app, probe
/// interval 100 ms: 800 ListContainers a second unbounded; with `runtime_reads_per_second =
/// 20`, each call's first read and then 20 a second, every call still ending within its hold.
#[tokio::test(start_paused = true)]
async fn held_calls_read_the_runtime_within_the_node_wide_bound() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.runtime_reads_per_second = 20;
    });
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.ready = None);
    fake.add("app", Some(t0));
    let (create, stop_msg) = (create(&fake, "app"), stop(&id_of(&fake, "proxy"), 30));
    let mut held = Vec::new();
    for i in 0..80u64 {
        let (engine, msg) = (
            engine.clone(),
            if i % 2 == 0 {
                create.clone()
            } else {
                stop_msg.clone()
            },
        );
        let call = Call {
            id: i + 1,
            ..call(
                if i % 2 == 0 {
                    "CreateContainer"
                } else {
                    "StopContainer"
                },
                KUBELET_DEADLINE,
            )
        };
        held.push(tokio::spawn(async move { run(&engine, &call, &msg).await }));
    }
    tokio::time::sleep(10 * S).await;
    let lists = fake.script().lists;
    assert!(
        lists <= 80 + 2 + 20 * 10,
        "{lists} ListContainers in 10 s: 80 first reads, the burst and 20 a second at most"
    );
    assert!(
        lists >= 80 + 20 * 9,
        "{lists}: the held calls still read at the bound"
    );
    for h in held {
        let (v, held) = h.await.unwrap();
        assert!(
            held <= 90 * S + 100 * MS,
            "held {held:?}: within the start timeout, before kubelet's deadline"
        );
        assert!(
            matches!(v, Verdict::Forward | Verdict::ForwardPatched(_)),
            "{v:?}"
        );
    }
}

/// A call's first read is not paced: with 40 calls held re-reading at one read a second, a
/// CreateContainer whose sidecar is ready is forwarded at once, not after their turns.
#[tokio::test(start_paused = true)]
async fn a_calls_first_read_never_waits_behind_held_calls() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.runtime_reads_per_second = 1;
    });
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let msg = create(&fake, "app");
    let mut held = Vec::new();
    for i in 0..40u64 {
        let (engine, msg) = (engine.clone(), msg.clone());
        let call = Call {
            id: i + 1,
            ..call("CreateContainer", KUBELET_DEADLINE)
        };
        held.push(tokio::spawn(async move { run(&engine, &call, &msg).await }));
    }
    tokio::time::sleep(5 * S).await;
    fake.set("proxy", |c| c.ready = Some(now()));
    let (v, waited) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, waited);
    for h in held {
        h.abort();
    }
}

/// Job watchers too: 40 Job pods whose apps run on, each watched at `job.poll_interval`
/// (100 ms here: 400 reads a second unbounded), read at `runtime_reads_per_second` together.
#[tokio::test(start_paused = true)]
async fn job_watchers_read_the_runtime_within_the_node_wide_bound() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[(annotations::JOB, "true")], |c| {
        c.job.poll_interval = 100 * MS;
        c.ordering.runtime_reads_per_second = 20;
    });
    fake.add("proxy", Some(now()));
    fake.add("app", Some(now()));
    for i in 0..40 {
        assert!(engine
            .pod_by_id(ApiVersion::V1, &format!("sb-{i}"))
            .await
            .is_some());
    }
    assert_eq!(engine.pods().len(), 40);
    tokio::time::sleep(10 * S).await;
    let lists = fake.script().lists;
    assert!(
        (20 * 9..=2 + 20 * 10).contains(&lists),
        "{lists} ListContainers in 10 s by 40 watchers: 20 a second"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue #19: who may aim a probe where

/// A pod annotation aimed at an address that is not the pod's: one warning and one
/// `crisp_bad_annotations_total` per pod however often it is probed, nothing connected to, and
/// the sidecar judged as if the key were absent (`running`: the app goes at once).
#[tokio::test(start_paused = true)]
async fn an_annotation_aimed_elsewhere_is_bad_once_and_treated_as_absent() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.script().annotations.insert(
        "crisp.dev/ready.proxy".into(),
        "http://192.0.2.1:10255/pods".into(),
    );
    fake.script().ip = Some("10.1.2.3".into());
    fake.add("proxy", Some(now()));
    for _ in 0..3 {
        let (v, held) = create_container(&engine, &fake, "app").await;
        assert_forwarded_at_once(&v, held);
    }
    assert_eq!(
        engine.metrics.bad_annotations.get(),
        1,
        "once per pod, not per probe"
    );
    assert_eq!(
        engine.metrics.probe_connects.get(),
        0,
        "nothing connected to"
    );
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    assert_eq!(
        p.and_then(|p| p.last_probe("proxy")).map(|l| l.result),
        Some(Ok(()))
    );
}

/// The same spec naming the pod's own IP, or a network the operator allowed, is probed.
#[tokio::test(start_paused = true)]
async fn an_annotation_naming_the_pods_ip_or_an_allowed_network_is_probed() {
    for (ip, allow) in [("192.0.2.1", vec![]), ("10.1.2.3", vec!["192.0.2.0/24"])] {
        let fake = Fake::default();
        fake.script().annotations = [
            (annotations::SIDECARS, "proxy"),
            ("crisp.dev/ready.proxy", "tcp://192.0.2.1:1"),
            (annotations::START_TIMEOUT, "1s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        fake.script().ip = Some(ip.into());
        let mut cfg = Config::default();
        cfg.ordering.probe_allow =
            crate::config::parse_cidrs(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        cfg.ordering.probe_timeout = 10 * MS;
        let engine = Engine::new(
            &cfg,
            fake.clone(),
            Arc::new(OrderingMetrics::default()),
            Arc::new(job::Terminated::open(None)),
        );
        fake.add("proxy", Some(now()));
        let _ = create_container(&engine, &fake, "app").await;
        assert_eq!(engine.metrics.bad_annotations.get(), 0, "{ip} {allow:?}");
        assert!(
            engine.metrics.probe_connects.get() > 0,
            "{ip} {allow:?}: not probed"
        );
    }
}

/// A CNI pod whose network namespace the runtime does not reveal: a probe of loopback fails
/// with the reason and never reaches the node's loopback (a listener there accepts nothing).
#[tokio::test(start_paused = true)]
async fn loopback_of_a_pod_whose_namespace_is_unknown_is_never_the_nodes() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let (fake, engine) = fake_pod(&["proxy"], &[(annotations::START_TIMEOUT, "1s")]);
    fake.script().annotations.insert(
        "crisp.dev/ready.proxy".into(),
        format!("tcp://127.0.0.1:{port}"),
    );
    fake.script().ip = Some("10.1.2.3".into());
    fake.add("proxy", Some(now()));
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, S, 100 * MS);
    assert_eq!(
        l.accept().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "crisp connected to the node's loopback"
    );
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    let why = p
        .and_then(|p| p.last_probe("proxy"))
        .map(|l| l.result)
        .unwrap()
        .unwrap_err();
    assert!(
        why.starts_with("cannot enter the pod's network namespace: "),
        "{why}"
    );
    assert_eq!(
        engine.metrics.probe_netns_failures.get(),
        1,
        "found (and logged) once per pod"
    );
    assert_eq!(
        engine.metrics.bad_annotations.get(),
        0,
        "loopback is the pod's own"
    );
}

/// Exec probes are paced like connects (issue #26): at one per second node-wide, a sidecar
/// probed every 100 ms gets about one ExecSync a second, and the rounds without a turn are
/// counted as limited.
#[tokio::test(start_paused = true)]
async fn exec_probes_take_the_node_wide_rate() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.probe_connects_per_second = 1;
        c.ordering.probe_timeout = 10 * MS;
    });
    fake.add_ready_after("proxy", 5 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert!(held >= 5 * S && held <= 7 * S, "held {held:?}");
    // ~50 rounds, ~6 tokens.
    let limited = engine.metrics.probe_limited.get();
    assert!(
        limited >= 35,
        "only {limited} of ~50 exec rounds waited for the rate"
    );
}

// ---------------------------------------------------------------------------------------------
// Live holds (the tap's hold events, `crisp pods`) and `refuse_held_after`

/// Records hold events, as the tap would stream them.
#[derive(Default)]
struct Recorder(Mutex<Vec<crate::intercept::HoldEvent>>);

impl HoldSink for Recorder {
    fn wanted(&self) -> bool {
        true
    }
    fn publish(&self, ev: crate::intercept::HoldEvent) {
        self.0.lock().unwrap().push(ev);
    }
}

impl Recorder {
    fn phases(&self) -> Vec<crate::intercept::HoldPhase> {
        self.0.lock().unwrap().iter().map(|e| e.phase).collect()
    }
}

fn recorded(engine: &Engine) -> Arc<Recorder> {
    let r = Arc::new(Recorder::default());
    engine.set_hold_sink(r.clone());
    r
}

#[tokio::test(start_paused = true)]
async fn a_hold_is_reported_live_with_its_reason_at_a_bounded_rate() {
    use crate::intercept::HoldPhase::*;
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let rec = recorded(&engine);
    fake.add_ready_after("proxy", 12 * S);
    let eng = engine.clone();
    let held = tokio::spawn(async move {
        run(
            &eng,
            &call("CreateContainer", KUBELET_DEADLINE),
            &create(&Fake(Arc::clone(&fake.0)), "app"),
        )
        .await
    });
    // While it is held: the start event says what it waits for, and `crisp pods` sees it.
    tokio::time::sleep(3 * S).await;
    {
        let evs = rec.0.lock().unwrap();
        let start = &evs[0];
        assert_eq!(start.phase, Start);
        assert_eq!(
            (
                start.waiting_on.as_str(),
                start.reason.as_str(),
                start.probe.as_str()
            ),
            ("proxy", "not ready", r#"exec:["true"]"#)
        );
        assert_eq!(
            start.probe_result, "exec exited 1",
            "the probe's last result"
        );
        assert_eq!(
            (
                start.pod_namespace.as_str(),
                start.pod_name.as_str(),
                start.container_name.as_str()
            ),
            ("ns", "pod", "app")
        );
        assert_eq!(start.policy, "proceed");
        assert!(
            start.time_left > 89 * S && start.time_left <= 90 * S,
            "{:?}",
            start.time_left
        );
    }
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    let now_held = p.expect("pod").held_calls();
    assert_eq!(now_held.len(), 1);
    assert_eq!(now_held[0].waiting.on, "proxy");
    assert!(
        now_held[0].time_left() <= 87 * S && now_held[0].time_left() > 86 * S,
        "{:?}",
        now_held[0].time_left()
    );
    let (v, held_for) = held.await.unwrap();
    assert_forward(&v);
    assert_held(held_for, 12 * S, 100 * MS);
    // ~120 probe rounds, nothing changed but time: an update every 5 s, no more.
    assert_eq!(rec.phases(), vec![Start, Update, Update, End]);
    let end = rec.0.lock().unwrap().last().cloned().unwrap();
    assert_eq!(end.outcome, "forwarded");
    assert!(end.held >= 12 * S);
    assert!(
        engine
            .lookup(Some(SANDBOX), None)
            .0
            .unwrap()
            .held_calls()
            .is_empty(),
        "no longer held"
    );
}

#[tokio::test(start_paused = true)]
async fn a_changing_reason_is_reported_at_most_once_a_second() {
    use crate::intercept::HoldPhase::*;
    let (fake, engine) = fake_pod(&["first", "second"], &[]);
    let rec = recorded(&engine);
    let t0 = now();
    fake.add("first", Some(t0));
    fake.add("second", Some(t0));
    // `first` turns ready at 2.5 s: the app then waits on `second` until 4 s.
    fake.set("first", |c| c.ready = Some(at(t0, 2500 * MS)));
    fake.set("second", |c| c.ready = Some(at(t0, 4 * S)));
    let (v, _) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    let evs = rec.0.lock().unwrap();
    assert_eq!(
        evs.iter().map(|e| e.phase).collect::<Vec<_>>(),
        vec![Start, Update, End]
    );
    assert_eq!(
        (evs[0].waiting_on.as_str(), evs[1].waiting_on.as_str()),
        ("first", "second")
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_reported_and_counted() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let rec = recorded(&engine);
    let (v, _) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v).to_string();
    let evs = rec.0.lock().unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].phase, crate::intercept::HoldPhase::Refused);
    assert_eq!(
        (evs[0].waiting_on.as_str(), evs[0].reason.as_str()),
        ("proxy", "not created")
    );
    assert_eq!(evs[0].message, msg);
    assert_eq!(
        engine
            .lookup(Some(SANDBOX), None)
            .0
            .unwrap()
            .refusals
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_hold_reports_that_kubelet_gave_up() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let rec = recorded(&engine);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let c = call("CreateContainer", KUBELET_DEADLINE);
    let msg = create(&fake, "app");
    // kubelet cancels after 2 s: the proxy drops the held future.
    let _ = tokio::time::timeout(2 * S, engine.on_request(&c, &msg)).await;
    let evs = rec.0.lock().unwrap();
    assert_eq!(
        evs.last().map(|e| (e.phase, e.outcome.as_str())),
        Some((crate::intercept::HoldPhase::End, "kubelet gave up"))
    );
    assert!(engine
        .lookup(Some(SANDBOX), None)
        .0
        .unwrap()
        .held_calls()
        .is_empty());
    assert_eq!(engine.metrics.holds_in_flight.get(), 0);
}

#[test]
fn refuse_held_after_is_on_by_default_and_bounded() {
    assert_eq!(
        Config::default().ordering.refuse_held_after,
        crate::config::DEFAULT_REFUSE_HELD_AFTER
    );
    let mut cfg = Config::default();
    cfg.ordering.refuse_held_after = 500 * MS;
    assert!(cfg
        .validate("test")
        .unwrap_err()
        .to_string()
        .contains("ordering.refuse_held_after"));
    cfg.ordering.refuse_held_after = Duration::ZERO;
    assert!(cfg.validate("test").is_ok(), "0s turns it off");
}

#[tokio::test(start_paused = true)]
async fn a_long_hold_ends_as_an_informative_refusal_and_the_timeout_still_counts_from_the_first() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = 30 * S
    });
    let rec = recorded(&engine);
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.ready = None);
    // kubelet: each refusal comes back 1.2 s later ("network is not ready", KUBELET-CRI §1.3).
    let mut refusals = Vec::new();
    let forwarded_at = loop {
        let (v, _) = create_container(&engine, &fake, "app").await;
        match v {
            Verdict::Forward => break now() - t0,
            v => refusals.push((now() - t0, refusal(&v).to_string())),
        }
        assert!(refusals.len() < 10, "never let through: {refusals:?}");
        tokio::time::sleep(1200 * MS).await;
    };
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert_held(refusals[0].0, 30 * S, 100 * MS);
    assert_held(refusals[1].0, 61200 * MS, 200 * MS);
    assert_eq!(
        refusals[0].1,
        r#"crisp: waiting for sidecar proxy of ns/pod: not ready: exec exited 1; held 30 s of 90 s; kubelet will retry "app" (network is not ready until the pod's sidecars run)"#
    );
    assert!(
        refusals[1].1.contains("held 61 s of 90 s"),
        "{}",
        refusals[1].1
    );
    // Policy proceed at the start timeout, counted from the first hold, not from the retry.
    assert_held(forwarded_at, 90 * S, 200 * MS);
    let outcomes: Vec<String> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.phase == crate::intercept::HoldPhase::End)
        .map(|e| e.outcome.clone())
        .collect();
    assert_eq!(
        outcomes,
        vec![
            "refused (still waiting)",
            "refused (still waiting)",
            "timed out (proceed)"
        ]
    );
    assert_eq!(
        engine
            .lookup(Some(SANDBOX), None)
            .0
            .unwrap()
            .refusals
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_short_hold_is_never_refused() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = 30 * S
    });
    fake.add_ready_after("proxy", 29 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, 29 * S, 100 * MS);
}

mod tenant;
