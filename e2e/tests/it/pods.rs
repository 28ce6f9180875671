//! Issue #14 end to end: pods as clusters ship them — Istio- and Linkerd-injected shapes with no
//! crisp annotation, a Job pod with an init container, a sidecar whose image cannot be pulled.
//! Real containerd, the kubelet emulator through grpc-go; every ordering assertion uses
//! containerd's own `created_at` / `started_at` / `finished_at`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use crisp_e2e::emulator::{PodPhase, PodSpec};
use crisp_e2e::stack::{secs, Stack};
use k8s_cri::v1 as cri;

const STEP: Duration = Duration::from_secs(60);
const S: i64 = 1_000_000_000;

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

/// An app that takes 1 s to exit after SIGTERM (so a sidecar stopped with it would finish first).
const APP: &str = "  - name: app\n    command: [sh, -c, \"trap 'sleep 1; exit 0' TERM; while true; do sleep 0.1; done\"]\n";

/// A proxy that serves `path` on `port` only `delay` s after it starts, and exits at once on
/// SIGTERM.
fn proxy(name: &str, port: u16, path: &str, delay: u32) -> String {
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    format!("  - name: {name}\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep {delay}; mkdir -p /www{dir}; echo ok > /www{dir}/{file}; httpd -f -p {port} -h /www & wait\"]\n")
}

/// The shape an injector leaves: its init container, its proxy before or after the app, and its
/// own annotations — no crisp annotation at all.
fn injected(
    name: &str,
    annotations: &str,
    init: &str,
    proxy_spec: &str,
    proxy_first: bool,
) -> String {
    let containers = if proxy_first {
        format!("{proxy_spec}{APP}")
    } else {
        format!("{APP}{proxy_spec}")
    };
    format!(
        "name: {name}\nterminationGracePeriodSeconds: 10\nannotations:\n{annotations}initContainers:\n  - name: {init}\n    command: [sh, -c, \"sleep 0.3\"]\ncontainers:\n{containers}"
    )
}

/// App created only after the proxy is ready, one app instance, the init container ran before
/// both, the proxy stopped after the app.
async fn mesh_pod(
    name: &str,
    annotations: &str,
    init: &str,
    proxy_name: &str,
    port: u16,
    path: &str,
    proxy_first: bool,
) -> Result<()> {
    let st = Stack::start(true, "", |_| {}).await?;
    let yaml = injected(
        name,
        annotations,
        init,
        &proxy(proxy_name, port, path, 3),
        proxy_first,
    );
    let uid = st.kubelet.add_pod(pod(&yaml))?;
    let r = st.kubelet.wait_all_running(&uid, STEP).await;
    if r.is_err() {
        st.dump(&uid);
    }
    r?;
    let inits = st.instances(&uid, init).await?;
    assert_eq!(inits.len(), 1, "{init} ran once");
    let init_st = &inits[0];
    let proxy_st = st.status(&uid, proxy_name).await?;
    let apps = st.instances(&uid, "app").await?;
    assert_eq!(apps.len(), 1, "exactly one app container: {apps:?}");
    let app = &apps[0];
    eprintln!(
        "{name}: {init} finished {:.3}, proxy started {:.3}, app created {:.3} (+{:.3} s)",
        secs(init_st.finished_at),
        secs(proxy_st.started_at),
        secs(app.created_at),
        secs(app.created_at - proxy_st.started_at)
    );
    assert_eq!(init_st.exit_code, 0);
    assert!(
        init_st.finished_at <= proxy_st.created_at,
        "{init} still ran when the proxy was created"
    );
    assert!(
        init_st.finished_at <= app.created_at,
        "{init} still ran when the app was created"
    );
    // Ready = proxy start + 3 s of sleep.
    assert!(
        app.created_at - proxy_st.started_at >= 3 * S,
        "app created {:.3} s after the proxy started, before it was ready",
        secs(app.created_at - proxy_st.started_at)
    );
    assert!(
        app.started_at - proxy_st.started_at <= 5 * S,
        "app started {:.3} s after the proxy: long after readiness",
        secs(app.started_at - proxy_st.started_at)
    );
    // Known init container: let through at once, not refused to find out what it is.
    let init_creates = st
        .kubelet
        .journal()
        .container_calls("CreateContainer", init);
    assert!(
        init_creates.iter().all(|c| c.is_ok()),
        "{init} was refused: {init_creates:?}"
    );

    st.kubelet.delete_pod(&uid, Some(10))?;
    let r = st.kubelet.wait_terminated(&uid, STEP).await;
    if r.is_err() {
        st.dump(&uid);
    }
    r?;
    let (proxy_st, app) = (
        st.status(&uid, proxy_name).await?,
        st.status(&uid, "app").await?,
    );
    eprintln!(
        "{name}: proxy finished {:.3} s after the app",
        secs(proxy_st.finished_at - app.finished_at)
    );
    assert!(
        app.finished_at < proxy_st.finished_at,
        "the proxy finished before the app"
    );
    assert_eq!(app.exit_code, 0);
    Ok(())
}

const ISTIO: &str = "  sidecar.istio.io/status: '{\"initContainers\":[\"istio-init\"],\"containers\":[\"istio-proxy\"],\"volumes\":[\"istio-envoy\",\"istio-data\"],\"imagePullSecrets\":null,\"revision\":\"default\"}'\n";
const LINKERD: &str = "  linkerd.io/proxy-version: stable-2.14.10\n  linkerd.io/created-by: linkerd/proxy-injector stable-2.14.10\n";

/// One test a mesh and an order: `test: (pod name, injector annotations, init container, proxy,
/// readiness port and path, proxy listed first)`, each run by [`mesh_pod`].
macro_rules! mesh_tests {
    ($($(#[doc = $doc:literal])* $test:ident: ($($arg:expr),+);)*) => {$(
        $(#[doc = $doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() -> Result<()> {
            mesh_pod($($arg),+).await
        }
    )*};
}

mesh_tests! {
    /// Istio's default order: the proxy listed after the app.
    istio_proxy_listed_last: ("istio-last", ISTIO, "istio-init", "istio-proxy", 15021, "/healthz/ready", false);
    /// holdApplicationUntilProxyStarts' order: the proxy listed first.
    istio_proxy_listed_first: ("istio-first", ISTIO, "istio-init", "istio-proxy", 15021, "/healthz/ready", true);
    /// Linkerd's default order: the proxy listed first.
    linkerd_proxy_listed_first: ("linkerd-first", LINKERD, "linkerd-init", "linkerd-proxy", 4191, "/ready", true);
    /// Linkerd with the proxy listed after the app.
    linkerd_proxy_listed_last: ("linkerd-last", LINKERD, "linkerd-init", "linkerd-proxy", 4191, "/ready", false);
}

/// A Job pod with an init container (named by nothing) and an annotated sidecar that runs
/// forever: the sidecar is ended after the app, reports exit 0 / Completed through crisp, and the
/// pod Succeeds. (The exited init container used to be taken for the finished app.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_with_init_container_completes() -> Result<()> {
    let st = Stack::start(
        false,
        "[job]\npoll_interval = \"100ms\"\nrestart_grace = \"2s\"\n",
        |_| {},
    )
    .await?;
    let yaml = "name: job-init\nhostNetwork: true\nrestartPolicy: Never\nlabels:\n  job-name: job-init\nannotations:\n  crisp.dev/sidecars: proxy\ninitContainers:\n  - name: init\n    command: [sh, -c, \"true\"]\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 143' TERM; sleep 3600 & wait\"]\n  - name: app\n    command: [sh, -c, \"sleep 2; exit 0\"]\n";
    let uid = st.kubelet.add_pod(pod(yaml))?;
    let r = st.kubelet.wait_phase(&uid, PodPhase::Succeeded, STEP).await;
    if r.is_err() {
        st.dump(&uid);
    }
    r?;
    let (init, proxy, app) = (
        st.status(&uid, "init").await?,
        st.status(&uid, "proxy").await?,
        st.status(&uid, "app").await?,
    );
    assert!(init.finished_at <= proxy.created_at);
    assert_eq!(app.exit_code, 0);
    assert!(
        proxy.finished_at > app.finished_at,
        "the sidecar ended before the app"
    );
    assert!(
        proxy.finished_at - app.finished_at < S,
        "the sidecar ended {:.3} s after the app",
        secs(proxy.finished_at - app.finished_at)
    );
    assert_eq!(proxy.exit_code, 143, "containerd keeps the real exit code");
    let seen = st
        .via_crisp()
        .await?
        .container_status(cri::ContainerStatusRequest {
            container_id: proxy.id.clone(),
            verbose: false,
        })
        .await?
        .into_inner()
        .status
        .context("empty status")?;
    assert_eq!((seen.exit_code, seen.reason.as_str()), (0, "Completed"));
    Ok(())
}

/// The sidecar listed after the app has an image that cannot be pulled (no such image here, and
/// no registry). Without the sidecar ever created, the app used to be taken for an init container
/// and let through.
const UNPULLABLE: &str = "crisp.test/late-proxy:latest";

fn unpullable_pod(name: &str, extra_annotations: &str) -> String {
    format!(
        "name: {name}\nhostNetwork: true\nterminationGracePeriodSeconds: 5\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: 'exec:[\"test\",\"-f\",\"/tmp/ready-{name}\"]'\n{extra_annotations}containers:\n{APP}  - name: proxy\n    image: {UNPULLABLE}\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 1; touch /tmp/ready-{name}; sleep 3600 & wait\"]\n"
    )
}

fn ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Asserts that no app instance runs for `d`, checking all along (not a sleep: it fails as soon
/// as one runs).
async fn assert_app_not_running_for(st: &Stack, uid: &str, d: Duration) -> Result<()> {
    let end = tokio::time::Instant::now() + d;
    while tokio::time::Instant::now() < end {
        let apps = st.instances(uid, "app").await?;
        if let Some(a) = apps
            .iter()
            .find(|a| a.state != cri::ContainerState::ContainerCreated as i32)
        {
            st.dump(uid);
            anyhow::bail!("the app ran without its sidecar: {a:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Starts a stack with the [`unpullable_pod`] `name` and checks for 15 s that its app does not
/// run: the stack and the pod's uid.
async fn unpullable_app_waits(name: &str, extra_annotations: &str) -> Result<(Stack, String)> {
    let st = Stack::start(false, "", |_| {}).await?;
    let uid = st
        .kubelet
        .add_pod(pod(&unpullable_pod(name, extra_annotations)))?;
    assert_app_not_running_for(&st, &uid, Duration::from_secs(15)).await?;
    Ok((st, uid))
}

/// ... and it starts once the image can be pulled, after the sidecar is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpullable_sidecar_holds_the_app_until_pullable() -> Result<()> {
    let (st, uid) = unpullable_app_waits("pull-late", "").await?;
    // kubelet did try the sidecar: pulls failed, then back-off.
    let pulls = st
        .kubelet
        .journal()
        .filter(|r| r.method == "PullImage" && r.meta.pod_uid.as_deref() == Some(uid.as_str()));
    assert!(
        !pulls.is_empty() && pulls.iter().all(|p| !p.is_ok()),
        "expected failed pulls of the sidecar's image: {pulls:?}"
    );
    st.containerd
        .tag_image("crisp.test/busybox:latest", UNPULLABLE)?;
    st.wait_all_running(&uid, STEP).await?;
    let (proxy, app) = (
        st.status(&uid, "proxy").await?,
        st.status(&uid, "app").await?,
    );
    assert!(
        app.created_at - proxy.started_at >= S,
        "app created {:.3} s after the sidecar started, before it was ready",
        secs(app.created_at - proxy.started_at)
    );
    assert_eq!(st.instances(&uid, "app").await?.len(), 1);
    st.kubelet.delete_pod(&uid, Some(5))?;
    st.kubelet.wait_terminated(&uid, STEP).await?;
    Ok(())
}

/// ... or, when it never can be, at the start timeout under policy `proceed` (counted from the
/// app's first refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpullable_sidecar_proceeds_at_the_start_timeout() -> Result<()> {
    let (st, uid) = unpullable_app_waits("pull-never", "  crisp.dev/start-timeout: 20s\n").await?;
    let r = st
        .kubelet
        .wait_for(&uid, STEP, |v| {
            v.container("app").is_some_and(|c| c.state.is_running())
        })
        .await;
    if r.is_err() {
        st.dump(&uid);
    }
    r?;
    let app = st.status(&uid, "app").await?;
    let first = st
        .kubelet
        .journal()
        .container_calls("CreateContainer", "app")
        .first()
        .cloned()
        .context("no CreateContainer for the app")?;
    let waited = app.created_at - ns(first.sent_wall);
    eprintln!(
        "app created {:.3} s after its first CreateContainer",
        secs(waited)
    );
    assert!(
        waited >= 20 * S,
        "app created {:.3} s after its first CreateContainer: before the 20 s start timeout",
        secs(waited)
    );
    assert!(
        waited <= 26 * S,
        "app created {:.3} s after its first CreateContainer: long after the start timeout",
        secs(waited)
    );
    assert!(st.instances(&uid, "proxy").await?.is_empty());
    assert!(st
        .crisp
        .log_text()
        .contains("no longer waiting for them (policy proceed)"));
    st.kubelet.delete_pod(&uid, Some(5))?;
    st.kubelet.wait_terminated(&uid, STEP).await?;
    Ok(())
}
