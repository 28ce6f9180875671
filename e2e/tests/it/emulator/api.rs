//! CRI API versions (KUBELET-CRI §7.5, §8.1): v1alpha2 mode drives containerd 1.6 end to end;
//! negotiation (kubelet 1.23) picks v1 when the runtime has it and falls back to v1alpha2, per
//! service, on Unimplemented; v1-only mode (1.26+) refuses a v1alpha2-only runtime. Deadlines travel
//! as `grpc-timeout` and are enforced as kubelet's context deadline (§3.3).

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::Result;
use crisp_e2e::emulator::testing::{sleeper_pod, Env, STEP};
use crisp_e2e::emulator::{
    connect_uds, ApiVersion, CallMeta, CriClient, Journal, Kubelet, KubeletConfig, KubeletVersion,
    Package, PodPhase, ProstCodec, Service,
};
use k8s_cri::v1 as cri;
use tonic::body::Body;
use tonic::codegen::http;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1alpha2_mode_runs_a_pod_on_containerd_1_6() -> Result<()> {
    let env = Env::start(|c| {
        c.version = KubeletVersion::V1_23;
        c.api = Some(ApiVersion::V1alpha2);
    })
    .await?;
    let k = &env.kubelet;
    assert_eq!(k.cri().runtime_package(), Package::V1alpha2);
    assert_eq!(k.cri().image_package(), Package::V1alpha2);
    let uid = k.add_pod(sleeper_pod("alpha", &["a", "b"]))?;
    if let Err(e) = k.wait_phase(&uid, PodPhase::Running, STEP).await {
        env.dump(&uid);
        return Err(e);
    }
    k.wait_all_running(&uid, STEP).await?;
    k.delete_and_wait(&uid, Some(3), STEP).await?;

    let calls = k.journal().calls();
    assert!(
        calls
            .iter()
            .all(|r| r.path.starts_with("/runtime.v1alpha2.")),
        "every call on v1alpha2"
    );
    // A call still in flight when the journal is read (the relist, Status) has no answer yet:
    // only answered calls can have failed.
    let failed = |r: &&crisp_e2e::emulator::CallRecord| {
        r.is_done() && !r.is_ok() && r.method != "ContainerStatus"
    };
    assert!(
        !calls.iter().any(|r| failed(&r)),
        "failures: {:?}",
        calls
            .iter()
            .filter(failed)
            .map(|r| (&r.path, r.code, &r.message))
            .collect::<Vec<_>>()
    );
    for m in [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "StopPodSandbox",
        "ImageStatus",
    ] {
        assert!(calls.iter().any(|r| r.method == m), "no {m}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiation_picks_v1_on_containerd_1_6() -> Result<()> {
    let env = Env::start(|c| c.version = KubeletVersion::V1_23).await?;
    let k = &env.kubelet;
    assert_eq!(k.cri().runtime_package(), Package::V1);
    assert_eq!(k.cri().image_package(), Package::V1);
    // The handshake: Version probe, ImageFsInfo probe, typed Version (§7.5).
    let first: Vec<_> = k
        .journal()
        .calls()
        .into_iter()
        .take(3)
        .map(|r| r.path)
        .collect();
    assert_eq!(
        first,
        [
            "/runtime.v1.RuntimeService/Version",
            "/runtime.v1.ImageService/ImageFsInfo",
            "/runtime.v1.RuntimeService/Version"
        ]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiation_falls_back_to_v1alpha2_on_unimplemented() -> Result<()> {
    let (dir, sock, server) = alpha_only_runtime()?;

    let mut cfg = KubeletConfig::fast(&sock, dir.path().join("pods"));
    cfg.version = KubeletVersion::V1_23;
    let k = Kubelet::new(cfg).await?;
    assert_eq!(k.cri().runtime_package(), Package::V1alpha2);
    assert_eq!(k.cri().image_package(), Package::V1alpha2);
    let calls: Vec<_> = k
        .journal()
        .calls()
        .into_iter()
        .take(3)
        .map(|r| (r.path, r.code))
        .collect();
    assert_eq!(
        calls,
        [
            (
                "/runtime.v1.RuntimeService/Version".to_string(),
                tonic::Code::Unimplemented
            ),
            (
                "/runtime.v1.ImageService/ImageFsInfo".to_string(),
                tonic::Code::Unimplemented
            ),
            (
                "/runtime.v1alpha2.RuntimeService/Version".to_string(),
                tonic::Code::Ok
            ),
        ]
    );
    // The PLEG and status loops keep using v1alpha2.
    k.journal()
        .wait_for(STEP, |r| {
            r.path == "/runtime.v1alpha2.RuntimeService/ListContainers" && r.is_ok()
        })
        .await?;
    k.shutdown().await;

    // kubelet 1.26 treats Unimplemented on v1 as fatal.
    let mut cfg = KubeletConfig::fast(&sock, dir.path().join("pods"));
    cfg.version = KubeletVersion::V1_26;
    let err = Kubelet::new(cfg)
        .await
        .err()
        .expect("v1-only kubelet must refuse a v1alpha2-only runtime");
    assert!(
        format!("{err:#}").contains("validate CRI v1 runtime API"),
        "{err:#}"
    );
    server.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_is_sent_as_grpc_timeout_and_enforced() -> Result<()> {
    let (_dir, sock, server) = alpha_only_runtime()?;
    let ch = connect_uds(&sock).await?;
    let journal = Journal::new();
    let cri = CriClient::connect(
        ch.clone(),
        ch,
        ApiVersion::Negotiate,
        Duration::from_millis(400),
        journal.clone(),
    )
    .await?;

    // A call the runtime never answers fails with kubelet's DeadlineExceeded after r.timeout.
    let t0 = Instant::now();
    let res = cri
        .unary::<_, cri::StartContainerResponse>(
            Service::Runtime,
            "Hang",
            cri::StartContainerRequest {
                container_id: "x".into(),
            },
            Some(cri.request_timeout()),
            CallMeta::default(),
            |_, _| {},
        )
        .await;
    let took = t0.elapsed();
    let err = res.expect_err("must time out");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
    assert_eq!(err.message(), "context deadline exceeded");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let rec = journal.method("Hang").pop().expect("journaled");
    assert_eq!(rec.code, tonic::Code::DeadlineExceeded);
    // The runtime saw kubelet's deadline in grpc-timeout.
    let seen = HANG_TIMEOUTS.lock().map(|v| v.clone()).unwrap_or_default();
    let ms: Vec<u64> = seen
        .iter()
        .filter_map(|h| parse_grpc_timeout_ms(h))
        .collect();
    assert!(
        ms.iter().any(|&m| (350..=400).contains(&m)),
        "grpc-timeout headers: {seen:?}"
    );
    server.abort();
    Ok(())
}

fn parse_grpc_timeout_ms(h: &str) -> Option<u64> {
    let (n, unit) = h.split_at(h.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => n * 3_600_000,
        "M" => n * 60_000,
        "S" => n * 1000,
        "m" => n,
        "u" => n / 1000,
        "n" => n / 1_000_000,
        _ => return None,
    })
}

static HANG_TIMEOUTS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

// --- a runtime that only speaks v1alpha2 (tonic's router answers Unimplemented for the rest) ---

#[derive(Clone)]
struct AlphaRuntime;
#[derive(Clone)]
struct AlphaImage;

impl tonic::server::NamedService for AlphaRuntime {
    const NAME: &'static str = "runtime.v1alpha2.RuntimeService";
}
impl tonic::server::NamedService for AlphaImage {
    const NAME: &'static str = "runtime.v1alpha2.ImageService";
}

type BoxFut = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

macro_rules! alpha_service {
    ($t:ty) => {
        impl tower::Service<http::Request<Body>> for $t {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = BoxFut;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, req: http::Request<Body>) -> BoxFut {
                Box::pin(async move { Ok(handle(req).await) })
            }
        }
    };
}
alpha_service!(AlphaRuntime);
alpha_service!(AlphaImage);

async fn unary<Req, Resp>(req: http::Request<Body>, resp: Resp) -> http::Response<Body>
where
    Req: prost::Message + Default + Send + Sync + 'static,
    Resp: prost::Message + Clone + Send + Sync + 'static,
{
    let svc = tower::service_fn(move |_: tonic::Request<Req>| {
        let resp = resp.clone();
        async move { Ok::<_, tonic::Status>(tonic::Response::new(resp)) }
    });
    tonic::server::Grpc::new(ProstCodec::<Resp, Req>::default())
        .unary(svc, req)
        .await
}

async fn handle(req: http::Request<Body>) -> http::Response<Body> {
    let ready = |t: &str| cri::RuntimeCondition {
        r#type: t.into(),
        status: true,
        ..Default::default()
    };
    match req.uri().path().rsplit('/').next().unwrap_or_default() {
        "Version" => {
            let v = cri::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "alpha-only".into(),
                runtime_version: "0".into(),
                runtime_api_version: "v1alpha2".into(),
            };
            unary::<cri::VersionRequest, _>(req, v).await
        }
        "Status" => {
            let s = cri::StatusResponse {
                status: Some(cri::RuntimeStatus {
                    conditions: vec![ready("RuntimeReady"), ready("NetworkReady")],
                }),
                ..Default::default()
            };
            unary::<cri::StatusRequest, _>(req, s).await
        }
        "ListPodSandbox" => {
            unary::<cri::ListPodSandboxRequest, _>(req, cri::ListPodSandboxResponse::default())
                .await
        }
        "ListContainers" => {
            unary::<cri::ListContainersRequest, _>(req, cri::ListContainersResponse::default())
                .await
        }
        "ImageFsInfo" => {
            unary::<cri::ImageFsInfoRequest, _>(req, cri::ImageFsInfoResponse::default()).await
        }
        "Hang" => {
            let t = req
                .headers()
                .get("grpc-timeout")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if let Ok(mut v) = HANG_TIMEOUTS.lock() {
                v.push(t.to_string());
            }
            // Never answers in time; the client gives up.
            tokio::time::sleep(Duration::from_secs(60)).await;
            tonic::Status::unavailable("too late").into_http()
        }
        _ => tonic::Status::unimplemented("not in this fake").into_http(),
    }
}

/// A runtime serving only CRI v1alpha2, on a socket in a fresh directory.
fn alpha_only_runtime() -> Result<(tempfile::TempDir, PathBuf, tokio::task::JoinHandle<()>)> {
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("alpha-only.sock");
    let server = serve_v1alpha2_only(&sock)?;
    Ok((dir, sock, server))
}

fn serve_v1alpha2_only(sock: &Path) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::UnixListener::bind(sock)?;
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        let conn = l.accept().await.map(|(s, _)| s);
        Some((conn, l))
    });
    let path: PathBuf = sock.to_path_buf();
    Ok(tokio::spawn(async move {
        let res = tonic::transport::Server::builder()
            .add_service(AlphaRuntime)
            .add_service(AlphaImage)
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = res {
            eprintln!("fake runtime on {} failed: {e}", path.display());
        }
    }))
}
