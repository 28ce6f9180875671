//! Issue #2, end to end: a pod sandbox and two containers are run, listed, inspected, stopped
//! and removed *through crisp* against a real containerd, and every List/Status response crisp
//! returns is byte-identical to the same call made directly to containerd — on both CRI
//! versions.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crisp_e2e::crisp::{Crisp, CrispOpts};
use crisp_e2e::harness::{
    create_and_start, cri_clients, host_network_sandbox, image_ref, require_root, run_pod_sandbox,
    shell_container, wait_log_line, Containerd, ContainerdOpts, BUSYBOX_IMAGE, TRAPPED_LOOP,
};
use crisp_e2e::raw;
use k8s_cri::v1 as cri;
use prost::Message;

fn sandbox_config(name: &str, log_dir: &Path) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        labels: [("app".to_string(), name.to_string())].into(),
        ..host_network_sandbox(name, "e2e", log_dir)
    }
}

/// Calls `path` directly, through crisp, and directly again; the answer through crisp must be
/// byte-identical (headers, body, trailers) to one of the direct answers. containerd lists some
/// things (images) in Go map order, so two direct answers may legitimately differ in order: such
/// a call is sampled up to 20 times. A crisp that changed any byte would never match.
async fn assert_identical(direct: &Path, via: &Path, path: &str, msg: &[u8]) -> Result<()> {
    let mut last = None;
    for _ in 0..20 {
        let d1 = raw::call(direct, path, msg).await?;
        let v = raw::call(via, path, msg).await?;
        let d2 = raw::call(direct, path, msg).await?;
        if v.grpc_status() != Some(0) {
            bail!("{path}: expected OK, got {v:?}");
        }
        if v == d1 || v == d2 {
            return Ok(());
        }
        last = Some((v, d1));
    }
    let (v, d1) = last.expect("at least one attempt");
    bail!("{path}: response through crisp differs from direct\n via: {v:?}\n direct: {d1:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_through_crisp_is_byte_identical() -> Result<()> {
    require_root();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let crisp = Crisp::start(ctrd.socket(), CrispOpts::default())?;
    let (mut rt, mut img) = cri_clients(crisp.socket()).await?;

    let log_dir = ctrd.dir().join("pods/transparency");
    std::fs::create_dir_all(&log_dir)?;
    let sb = sandbox_config("transparency", &log_dir);
    let pod = run_pod_sandbox(&mut rt, &sb).await?;
    let busybox = image_ref(&mut img, BUSYBOX_IMAGE).await?;

    let mut ids = Vec::new();
    for name in ["first", "second"] {
        let cfg = shell_container(name, &busybox, TRAPPED_LOOP);
        ids.push(create_and_start(&mut rt, &pod, &sb, cfg).await?);
        wait_log_line(
            &log_dir.join(format!("{name}.log")),
            "trap-set",
            Duration::from_secs(10),
        )
        .await?;
    }
    // Both running, seen through crisp.
    let listed = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .into_inner()
        .containers;
    assert_eq!(listed.len(), 2);
    assert!(
        listed
            .iter()
            .all(|c| c.state == cri::ContainerState::ContainerRunning as i32),
        "{listed:?}"
    );

    // Every List/Status call, both CRI versions, byte for byte.
    for v in ["v1", "v1alpha2"] {
        let rs = format!("/runtime.{v}.RuntimeService");
        let is = format!("/runtime.{v}.ImageService");
        let calls: Vec<(String, Vec<u8>)> = vec![
            (
                format!("{rs}/Version"),
                cri::VersionRequest { version: v.into() }.encode_to_vec(),
            ),
            (
                format!("{rs}/Status"),
                cri::StatusRequest { verbose: false }.encode_to_vec(),
            ),
            (
                format!("{rs}/ListPodSandbox"),
                cri::ListPodSandboxRequest { filter: None }.encode_to_vec(),
            ),
            (
                format!("{rs}/PodSandboxStatus"),
                cri::PodSandboxStatusRequest {
                    pod_sandbox_id: pod.clone(),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
            (
                format!("{rs}/ListContainers"),
                cri::ListContainersRequest { filter: None }.encode_to_vec(),
            ),
            (
                format!("{rs}/ListContainers"),
                cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        pod_sandbox_id: pod.clone(),
                        ..Default::default()
                    }),
                }
                .encode_to_vec(),
            ),
            (
                format!("{rs}/ContainerStatus"),
                cri::ContainerStatusRequest {
                    container_id: ids[0].clone(),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
            (
                format!("{rs}/ContainerStatus"),
                cri::ContainerStatusRequest {
                    container_id: ids[1].clone(),
                    verbose: true,
                }
                .encode_to_vec(),
            ),
            (
                format!("{is}/ListImages"),
                cri::ListImagesRequest { filter: None }.encode_to_vec(),
            ),
            (
                format!("{is}/ImageStatus"),
                cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: BUSYBOX_IMAGE.into(),
                        ..Default::default()
                    }),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
        ];
        for (path, msg) in calls {
            assert_identical(ctrd.socket(), crisp.socket(), &path, &msg).await?;
        }
        // An error status from the runtime passes through verbatim too.
        let missing = cri::ContainerStatusRequest {
            container_id: "does-not-exist".into(),
            verbose: false,
        }
        .encode_to_vec();
        let d = raw::call(ctrd.socket(), &format!("{rs}/ContainerStatus"), &missing).await?;
        let via = raw::call(crisp.socket(), &format!("{rs}/ContainerStatus"), &missing).await?;
        assert_eq!(via, d);
        assert_eq!(via.grpc_status(), Some(5), "NotFound expected: {via:?}");
    }

    // Stop and remove through crisp.
    for id in &ids {
        rt.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 5,
        })
        .await?;
        let st = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status
            .context("status")?;
        assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
        assert_eq!(st.exit_code, 0, "the container's TERM trap exits 0");
        rt.remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await?;
    }
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = rt
            .list_containers(cri::ListContainersRequest { filter: None })
            .await?
            .into_inner()
            .containers;
        let pods = rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await?
            .into_inner()
            .items;
        if left.is_empty() && pods.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("left behind: {left:?} {pods:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Issue #34: calls of kubelets 1.28–1.36 that containerd 1.6 does not serve — RuntimeConfig
/// (1.28+: kubelet falls back to its own `cgroupDriver` only on Unimplemented, so crisp must
/// never answer it), UpdatePodSandboxResources (1.32+), 1.36's server-streaming
/// StreamPodSandboxes and a method of no CRI revision — made by a grpc-go client (kubelet's
/// stack) with kubelet's tracing metadata, directly and through crisp with a `--full --all` tap
/// attached (the observed path): the client gets containerd's own status, message, metadata
/// and messages through crisp exactly as directly (raw HTTP/2 too: headers, body and trailers
/// byte for byte), and the tap shows containerd's message, not one of crisp's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_kubelet_calls_get_containerds_own_answers() -> Result<()> {
    use crisp_e2e::grpcgo::{self, CallOpts};
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    require_root();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let crisp = Crisp::start(ctrd.socket(), CrispOpts::default())?;
    let mut tap = Command::new(crisp_e2e::crisp::crisp_binary()?)
        .args(["tap", "--json", "--full", "--all", "--admin-socket"])
        .arg(crisp.dir().join("admin.sock"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut err = BufReader::new(tap.stderr.take().context("stderr")?);
    let mut first = String::new();
    err.read_line(&mut first)?;
    if !first.contains("attached") {
        bail!("crisp tap did not attach: {first}");
    }
    let (tx, lines) = std::sync::mpsc::channel::<serde_json::Value>();
    let out = tap.stdout.take().context("stdout")?;
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&l) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });

    let tracing: Vec<(String, String)> = [
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        ("tracestate", "rojo=00f067aa0ba902b7"),
        ("baggage", "k8s.node=node-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // UpdatePodSandboxResourcesRequest (cri-api v0.33): pod_sandbox_id 1, resources 3.
    let resize = {
        let res = cri::LinuxContainerResources {
            cpu_quota: 250_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 512 << 20,
            ..Default::default()
        }
        .encode_to_vec();
        let mut m = vec![0x0a, 9];
        m.extend_from_slice(b"sb-resize");
        m.push(0x1a);
        m.push(res.len() as u8);
        m.extend_from_slice(&res);
        m
    };
    let rs = "/runtime.v1.RuntimeService";
    let calls: Vec<(String, bool, Vec<u8>)> = vec![
        (
            format!("{rs}/RuntimeConfig"),
            false,
            cri::RuntimeConfigRequest {}.encode_to_vec(),
        ),
        (format!("{rs}/UpdatePodSandboxResources"), false, resize),
        (format!("{rs}/StreamPodSandboxes"), true, Vec::new()),
        (format!("{rs}/StreamFutureThings"), true, Vec::new()),
    ];
    for (path, stream, req) in &calls {
        let opts = CallOpts {
            stream: *stream,
            metadata: tracing.clone(),
            ..Default::default()
        };
        let d = grpcgo::call(ctrd.socket(), path, req, opts.clone()).await?;
        let v = grpcgo::call(crisp.socket(), path, req, opts).await?;
        let (d, v) = (
            d.calls.first().context("direct: no call line")?,
            v.calls.first().context("through crisp: no call line")?,
        );
        if d.code != "Unimplemented" || d.message.is_empty() {
            bail!("{path}: containerd 1.6 was expected to answer Unimplemented: {d:?}");
        }
        let key = |c: &grpcgo::CallResult| {
            (
                c.code.clone(),
                c.message.clone(),
                c.response_hex.clone(),
                c.responses_hex.clone(),
                c.header.clone(),
                c.trailer.clone(),
            )
        };
        if key(v) != key(d) {
            bail!("{path}: through crisp {v:?}\ndirect {d:?}");
        }
        let rd = raw::call(ctrd.socket(), path, req).await?;
        let rv = raw::call(crisp.socket(), path, req).await?;
        if rv != rd {
            bail!("{path}: raw HTTP/2 answer differs\n via: {rv:?}\n direct: {rd:?}");
        }
        // The tap's events (the grpc-go call's, then the raw one's): containerd's message.
        for n in 0..2 {
            let deadline = Instant::now() + Duration::from_secs(10);
            let ev = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let ev = lines
                    .recv_timeout(left)
                    .with_context(|| format!("no tap event {n} for {path}"))?;
                if ev["path"] == path.as_str() {
                    break ev;
                }
            };
            if ev["code"] != 12 || ev["message"] != d.message.as_str() {
                bail!(
                    "{path}: the tap shows {ev}, not containerd's {:?}",
                    d.message
                );
            }
        }
    }
    let _ = tap.kill();
    let _ = tap.wait();
    Ok(())
}
