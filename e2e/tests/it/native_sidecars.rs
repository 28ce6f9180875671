//! Native sidecars (KEP-753: init containers with `restartPolicy: Always`, on by default from
//! kubelet 1.29) through crisp: kubelet already starts them first and stops them last, and the
//! CRI does not say a container is one. What crisp does to such pods is defined as: **nothing**
//! — no call held, none refused, the runtime's order is kubelet's — unless the pod names the
//! native sidecar in `crisp.dev/ready.<name>` (issue #35, DESIGN.md §3.7): then the apps'
//! CreateContainer waits until it is ready (the tests at the end of this file).
//! - Istio's and Linkerd's native-sidecar modes are recognised from their own annotations and
//!   left to kubelet (the injector table's `unless`).
//! - A pod that still names its (now native) sidecar in `crisp.dev/sidecars` is gated, but every
//!   gate is already open when kubelet 1.29 calls: the sidecar runs before any app is created
//!   and the apps have exited before the sidecar is stopped.
//!
//! kubelet 1.29's calls are replayed in its order (init containers one at a time, a restartable
//! one counted as done once it runs; on termination the regular containers first, then the
//! sidecars in reverse) by a grpc-go client → crisp → real containerd. Timestamps are the
//! runtime's.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use crisp_e2e::crisp::{Crisp, CrispOpts};
use crisp_e2e::grpcgo::{GoBridge, GoBridgeOpts};
use crisp_e2e::harness::{
    container_status, cri_clients, host_network_sandbox, image_ref, require_root, run_pod_sandbox,
    shell_container, wait_container, wait_log_line, Containerd, ContainerdOpts, BUSYBOX_IMAGE,
    TRAPPED_LOOP,
};
use k8s_cri::v1 as cri;

type Rt = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

/// A call crisp held or refused would take at least one probe interval or fail; kubelet's own
/// calls here take milliseconds. Generous for a loaded CI machine.
const UNHELD: Duration = Duration::from_secs(2);

struct Shape {
    name: &'static str,
    annotations: &'static [(&'static str, &'static str)],
    /// (name, restartable, command)
    init: &'static [(&'static str, bool, &'static str)],
    containers: &'static [&'static str],
}

fn sandbox_config(shape: &Shape, log_dir: &Path) -> cri::PodSandboxConfig {
    let mut sb = host_network_sandbox(shape.name, "native", log_dir);
    sb.annotations.extend(
        shape
            .annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    sb
}

struct Timed<'a> {
    rt: &'a mut Rt,
    slowest: (Duration, String),
}

impl Timed<'_> {
    fn note(&mut self, what: String, t: Instant) {
        let d = t.elapsed();
        if d > self.slowest.0 {
            self.slowest = (d, what);
        }
    }

    async fn create_start(
        &mut self,
        pod: &str,
        sb: &cri::PodSandboxConfig,
        image: &str,
        name: &str,
        cmd: &str,
    ) -> Result<String> {
        let config = shell_container(name, image, cmd);
        let t = Instant::now();
        let id = self
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.into(),
                config: Some(config),
                sandbox_config: Some(sb.clone()),
            })
            .await
            .with_context(|| format!("CreateContainer {name}"))?
            .into_inner()
            .container_id;
        self.note(format!("CreateContainer {name}"), t);
        let t = Instant::now();
        self.rt
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .with_context(|| format!("StartContainer {name}"))?;
        self.note(format!("StartContainer {name}"), t);
        Ok(id)
    }

    async fn status(&mut self, id: &str) -> Result<cri::ContainerStatus> {
        container_status(self.rt, id).await
    }

    async fn stop(&mut self, name: &str, id: &str) -> Result<()> {
        let t = Instant::now();
        self.rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.into(),
                timeout: 10,
            })
            .await
            .with_context(|| format!("StopContainer {name}"))?;
        self.note(format!("StopContainer {name}"), t);
        Ok(())
    }
}

/// Replays kubelet 1.29's calls for `shape` through grpc-go → crisp → containerd and checks
/// that crisp held and refused nothing and the runtime saw kubelet's own order.
async fn native_pod(shape: Shape) -> Result<()> {
    let NativeStack {
        ctrd,
        crisp,
        _dir,
        bridge,
    } = native_stack().await?;
    let r = replay(&ctrd, bridge.socket(), &shape).await;
    let log = crisp.log_text();
    if r.is_err() {
        eprintln!("--- crisp log ---\n{log}");
    }
    r?;
    let touched: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("holding") || l.contains("refusing") || l.contains("stopping sidecar")
        })
        .collect();
    ensure!(
        touched.is_empty(),
        "crisp acted on a native-sidecar pod ({}):\n{}",
        shape.name,
        touched.join("\n")
    );
    Ok(())
}

/// Waits until container `name`, logging into `log_dir`, has set its SIGTERM trap.
async fn trap_set(log_dir: &Path, name: &str) -> Result<()> {
    wait_log_line(
        &log_dir.join(format!("{name}.log")),
        "trap-set",
        Duration::from_secs(20),
    )
    .await
}

async fn replay(ctrd: &Containerd, via: &Path, shape: &Shape) -> Result<()> {
    let (mut rt, mut img) = cri_clients(via).await?;
    let image = image_ref(&mut img, BUSYBOX_IMAGE).await?;
    let log_dir = ctrd.dir().join("pods").join(shape.name);
    std::fs::create_dir_all(&log_dir)?;
    let sb = sandbox_config(shape, &log_dir);
    let pod = run_pod_sandbox(&mut rt, &sb).await?;
    let mut t = Timed {
        rt: &mut rt,
        slowest: (Duration::ZERO, String::new()),
    };

    // Init containers one at a time; a restartable one is done once it runs (kubelet 1.29).
    let mut sidecars = Vec::new();
    for (name, restartable, cmd) in shape.init {
        let id = t.create_start(&pod, &sb, &image, name, cmd).await?;
        if *restartable {
            wait_container(t.rt, &id, "running", Duration::from_secs(20), |s| {
                s.state == cri::ContainerState::ContainerRunning as i32
            })
            .await?;
            trap_set(&log_dir, name).await?;
            sidecars.push((*name, id));
        } else {
            let st = wait_container(t.rt, &id, "exited", Duration::from_secs(20), |s| {
                s.state == cri::ContainerState::ContainerExited as i32
            })
            .await?;
            ensure!(st.exit_code == 0, "init container {name} failed: {st:?}");
        }
    }
    let mut apps = Vec::new();
    for name in shape.containers {
        let id = t
            .create_start(&pod, &sb, &image, name, TRAPPED_LOOP)
            .await?;
        trap_set(&log_dir, name).await?;
        apps.push((*name, id));
    }

    // Termination: regular containers first, then the sidecars in reverse order.
    for (name, id) in &apps {
        t.stop(name, id).await?;
    }
    for (name, id) in sidecars.iter().rev() {
        t.stop(name, id).await?;
    }
    let t0 = Instant::now();
    t.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await?;
    t.note("StopPodSandbox".into(), t0);

    // The runtime's own timestamps: every sidecar started before and finished after every app.
    let mut app_times = Vec::new();
    for (name, id) in &apps {
        let st = t.status(id).await?;
        ensure!(
            st.exit_code == 0,
            "{name} did not exit on its TERM trap: {st:?}"
        );
        app_times.push((st.started_at, st.finished_at));
    }
    for (name, id) in &sidecars {
        let st = t.status(id).await?;
        ensure!(st.exit_code == 0, "sidecar {name}: {st:?}");
        for (started, finished) in &app_times {
            ensure!(
                st.started_at < *started && st.finished_at > *finished,
                "sidecar {name} does not wrap the apps: {st:?}"
            );
        }
    }
    let (slowest, what) = t.slowest.clone();
    eprintln!(
        "{}: slowest call through crisp: {what} in {slowest:?}",
        shape.name
    );
    ensure!(slowest < UNHELD, "{what} took {slowest:?}: crisp held it");
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await?;
    Ok(())
}

/// One test a pod shape, each replayed by [`native_pod`]: `test: Shape { … };`.
macro_rules! native_tests {
    ($($(#[doc = $doc:literal])* $test:ident: $shape:expr;)*) => {$(
        $(#[doc = $doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() -> Result<()> {
            native_pod($shape).await
        }
    )*};
}

native_tests! {
    /// Istio's native-sidecar mode: `istio-proxy` is listed under initContainers in its status.
    istio_native_sidecar_pod_is_left_to_kubelet: Shape {
        name: "istio-native",
        annotations: &[("sidecar.istio.io/status", r#"{"initContainers":["istio-init","istio-proxy"],"containers":null,"volumes":["istio-envoy"]}"#)],
        init: &[("istio-init", false, "true"), ("istio-proxy", true, TRAPPED_LOOP)],
        containers: &["app"],
    };
    /// Linkerd with `config.beta.linkerd.io/proxy-enable-native-sidecar`.
    linkerd_native_sidecar_pod_is_left_to_kubelet: Shape {
        name: "linkerd-native",
        annotations: &[("linkerd.io/proxy-version", "edge-24.5.1"), ("config.beta.linkerd.io/proxy-enable-native-sidecar", "true")],
        init: &[("linkerd-init", false, "true"), ("linkerd-proxy", true, TRAPPED_LOOP)],
        containers: &["app", "worker"],
    };
    /// A pod moved to a native sidecar that still carries `crisp.dev/sidecars`: gated, but every
    /// gate is already open when kubelet 1.29 calls.
    annotated_native_sidecar_is_never_held: Shape {
        name: "annotated-native",
        annotations: &[("crisp.dev/sidecars", "proxy"), ("crisp.dev/init-containers", "setup")],
        init: &[("setup", false, "true"), ("proxy", true, TRAPPED_LOOP)],
        containers: &["app"],
    };
}

// Issue #35: readiness on native sidecars, opt-in. kubelet 1.29 waits only for a native
// sidecar's "started" (no startupProbe here), so its next sync creates the apps as soon as the
// sidecar runs. A pod that names the sidecar in `crisp.dev/ready.<name>` gets the apps'
// CreateContainer held until crisp's probe finds it ready; a pod that does not is untouched.

/// The native sidecar turns ready this long after its process starts.
const READY_AFTER: Duration = Duration::from_secs(2);
/// How the pod names its readiness: a file the sidecar writes `READY_AFTER` after it starts.
const READY_FILE_PROBE: &str = r#"exec:["test","-f","/tmp/ready"]"#;

/// What the runtime recorded of one replay: its own timestamps (ns).
struct LateReady {
    sidecar_started: i64,
    app_created: i64,
    /// The app's CreateContainer as kubelet saw it.
    app_create_took: Duration,
}

impl LateReady {
    /// How long after the sidecar started the app was created, by the runtime's clock.
    fn gap(&self) -> Duration {
        Duration::from_nanos((self.app_created - self.sidecar_started).max(0) as u64)
    }
}

/// kubelet 1.29's calls for a pod with one native sidecar `proxy` (ready `READY_AFTER` after it
/// starts) and one app, sent to `via`: RunPodSandbox, the sidecar's Create and Start, then —
/// once the sidecar runs, which is all kubelet waits for — the app's Create and Start; then
/// termination in kubelet's order (app, then sidecar).
async fn replay_late_ready(
    ctrd: &Containerd,
    via: &Path,
    name: &str,
    named: bool,
) -> Result<LateReady> {
    let (mut rt, mut img) = cri_clients(via).await?;
    let image = image_ref(&mut img, BUSYBOX_IMAGE).await?;
    let log_dir = ctrd.dir().join("pods").join(name);
    std::fs::create_dir_all(&log_dir)?;
    let mut sb = host_network_sandbox(name, "native", &log_dir);
    if named {
        sb.annotations
            .insert("crisp.dev/ready.proxy".into(), READY_FILE_PROBE.into());
    }
    let pod = run_pod_sandbox(&mut rt, &sb).await?;
    let mut t = Timed {
        rt: &mut rt,
        slowest: (Duration::ZERO, String::new()),
    };
    let sidecar_cmd = format!(
        "(sleep {}; touch /tmp/ready) & {TRAPPED_LOOP}",
        READY_AFTER.as_secs()
    );
    let proxy = t
        .create_start(&pod, &sb, &image, "proxy", &sidecar_cmd)
        .await?;
    wait_container(t.rt, &proxy, "running", Duration::from_secs(20), |s| {
        s.state == cri::ContainerState::ContainerRunning as i32
    })
    .await?;
    let started = Instant::now();
    let app = t
        .create_start(&pod, &sb, &image, "app", TRAPPED_LOOP)
        .await?;
    let app_create_took = started.elapsed();
    trap_set(&log_dir, "app").await?;
    t.stop("app", &app).await?;
    t.stop("proxy", &proxy).await?;
    let sidecar = t.status(&proxy).await?;
    let app_status = t.status(&app).await?;
    t.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await?;
    t.rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await?;
    ensure!(
        sidecar.started_at > 0 && app_status.created_at > 0,
        "no timestamps: {sidecar:?} {app_status:?}"
    );
    Ok(LateReady {
        sidecar_started: sidecar.started_at,
        app_created: app_status.created_at,
        app_create_took,
    })
}

/// crisp (behind kubelet's grpc-go client) on a private containerd.
struct NativeStack {
    ctrd: Containerd,
    crisp: Crisp,
    bridge: GoBridge,
    _dir: tempfile::TempDir,
}

async fn native_stack() -> Result<NativeStack> {
    require_root();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let crisp = Crisp::start(ctrd.socket(), CrispOpts::default())?;
    let dir = tempfile::Builder::new().prefix("crisp-native-").tempdir()?;
    let bridge = GoBridge::start(
        &dir.path().join("kubelet.sock"),
        crisp.socket(),
        GoBridgeOpts::default(),
    )?;
    Ok(NativeStack {
        ctrd,
        crisp,
        bridge,
        _dir: dir,
    })
}

/// Named in `crisp.dev/ready.proxy`: the app is created only once the sidecar is ready — by
/// containerd's own clock, at least `READY_AFTER` after the sidecar started — and promptly then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_native_sidecar_holds_the_app_until_ready() -> Result<()> {
    let s = native_stack().await?;
    let r = replay_late_ready(&s.ctrd, s.bridge.socket(), "native-named", true).await;
    let log = s.crisp.log_text();
    let r = r.inspect_err(|_| eprintln!("--- crisp log ---\n{log}"))?;
    eprintln!(
        "named: app created {:?} after the sidecar started (ready after {READY_AFTER:?}); its CreateContainer took {:?}",
        r.gap(),
        r.app_create_took
    );
    // The sidecar's `sleep` starts after containerd records its start: ready no earlier than
    // READY_AFTER after started_at, less the few ms between exec and the record.
    ensure!(
        r.gap() >= READY_AFTER - Duration::from_millis(100),
        "the app was created {:?} after the sidecar started, before it was ready ({READY_AFTER:?})\n{log}",
        r.gap()
    );
    ensure!(
        r.gap() < READY_AFTER + Duration::from_secs(2),
        "the app was released late: {:?} after the sidecar started",
        r.gap()
    );
    ensure!(
        log.contains("holding CreateContainer") && log.contains("sidecars ready; forwarding"),
        "crisp did not hold the app:\n{log}"
    );
    Ok(())
}

/// Not named: crisp does nothing — the app is created as soon as kubelet asks, before the
/// sidecar is ready, as it is with no crisp at all (the same replay straight to containerd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_sidecar_not_named_is_untouched_like_direct() -> Result<()> {
    let s = native_stack().await?;
    let via = replay_late_ready(&s.ctrd, s.bridge.socket(), "native-unnamed", false).await;
    let log = s.crisp.log_text();
    let via = via.inspect_err(|_| eprintln!("--- crisp log ---\n{log}"))?;
    let direct = replay_late_ready(&s.ctrd, s.ctrd.socket(), "native-direct", false).await?;
    eprintln!(
        "unnamed: app created {:?} after the sidecar started through crisp, {:?} direct",
        via.gap(),
        direct.gap()
    );
    for (how, r) in [("through crisp", &via), ("direct", &direct)] {
        ensure!(
            r.gap() < READY_AFTER && r.app_create_took < UNHELD,
            "{how}: the app was created {:?} after the sidecar started (CreateContainer took {:?}): held",
            r.gap(),
            r.app_create_took
        );
    }
    ensure!(
        via.gap().abs_diff(direct.gap()) < Duration::from_secs(1),
        "through crisp {:?}, direct {:?}",
        via.gap(),
        direct.gap()
    );
    let touched: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("holding") || l.contains("refusing"))
        .collect();
    ensure!(touched.is_empty(), "crisp acted:\n{}", touched.join("\n"));
    Ok(())
}
