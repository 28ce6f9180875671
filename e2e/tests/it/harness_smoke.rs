//! Smoke tests of the real-runtime harness: a private containerd runs a
//! host-network pod with a busybox container through the whole CRI lifecycle,
//! and a CNI pod gets an IP.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crisp_e2e::harness::{
    container_status, create_and_start, cri_clients, named_container, remove_the_pod, require_root,
    run_pod_with, wait_container, wait_log_line, Containerd, ContainerdOpts, BUSYBOX_IMAGE,
    PAUSE_IMAGE,
};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

type Rt = RuntimeServiceClient<Channel>;

fn sandbox_config(name: &str, log_dir: &Path, host_network: bool) -> cri::PodSandboxConfig {
    let network = if host_network {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: if host_network {
            String::new()
        } else {
            name.into()
        },
        log_directory: log_dir.display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: network as i32,
                    pid: cri::NamespaceMode::Container as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str, command: &[&str]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        command: command.iter().map(|s| s.to_string()).collect(),
        // kubelet's layout: <pod log dir>/<container>/<restart>.log
        log_path: format!("{name}/0.log"),
        ..named_container(name, image)
    }
}

/// Polls ContainerStatus until the container is in `state`.
async fn wait_state(
    rt: &mut Rt,
    id: &str,
    state: cri::ContainerState,
    timeout: Duration,
) -> Result<cri::ContainerStatus> {
    wait_container(rt, id, &format!("{state:?}"), timeout, |st| {
        st.state == state as i32
    })
    .await
}

async fn image_id(img: &mut ImageServiceClient<Channel>, name: &str) -> Result<String> {
    let image = crisp_e2e::harness::image_status(img, name).await?;
    assert!(
        image.repo_tags.iter().any(|t| t == name),
        "ImageStatus {name}: repo_tags {:?}",
        image.repo_tags
    );
    assert!(image.id.starts_with("sha256:"), "image id {:?}", image.id);
    Ok(image.id)
}

/// A containerd of the harness (as root), saying how long it took to come up.
async fn timed_containerd(cni: bool) -> Result<Containerd> {
    require_root();
    let t0 = Instant::now();
    let ctrd = Containerd::start_async(ContainerdOpts { cni }).await?;
    eprintln!(
        "containerd (cni: {cni}) ready in {:?} on {}",
        t0.elapsed(),
        ctrd.socket().display()
    );
    Ok(ctrd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_pod_lifecycle() -> Result<()> {
    let mut ctrd = timed_containerd(false).await?;

    let (mut rt, mut img) = cri_clients(ctrd.socket()).await?;
    let version = rt
        .version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await?
        .into_inner();
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");

    let busybox_id = image_id(&mut img, BUSYBOX_IMAGE).await?;
    image_id(&mut img, PAUSE_IMAGE).await?;

    let log_dir = ctrd.dir().join("pods").join("smoke");
    std::fs::create_dir_all(log_dir.join("busybox"))?;
    std::fs::create_dir_all(log_dir.join("by-id"))?;
    let sb_config = sandbox_config("smoke", &log_dir, true);

    let t_pod = Instant::now();
    let busybox = container_config("busybox", BUSYBOX_IMAGE, &["sh", "-c", "echo hi; sleep 30"]);
    let (pod_id, ctr_id) = run_pod_with(&mut rt, &sb_config, busybox)
        .await
        .context("image by name")?;
    let st = wait_state(
        &mut rt,
        &ctr_id,
        cri::ContainerState::ContainerRunning,
        Duration::from_secs(10),
    )
    .await?;
    eprintln!(
        "pod + container running {:?} after RunPodSandbox",
        t_pod.elapsed()
    );
    assert!(st.started_at > 0, "started_at not set: {st:?}");
    assert_eq!(st.image_ref, busybox_id, "{st:?}");
    wait_log_line(
        &log_dir.join("busybox/0.log"),
        "hi",
        Duration::from_secs(10),
    )
    .await?;
    let log = std::fs::read_to_string(log_dir.join("busybox/0.log"))?;
    assert!(log.contains(" stdout F hi"), "CRI log format: {log:?}");

    // The image referenced by its id from ImageStatus works as well.
    let by_id = create_and_start(
        &mut rt,
        &pod_id,
        &sb_config,
        container_config("by-id", &busybox_id, &["true"]),
    )
    .await
    .context("image by id")?;
    let st = wait_state(
        &mut rt,
        &by_id,
        cri::ContainerState::ContainerExited,
        Duration::from_secs(10),
    )
    .await?;
    assert_eq!(st.exit_code, 0, "{st:?}");
    rt.remove_container(cri::RemoveContainerRequest {
        container_id: by_id,
    })
    .await?;

    rt.stop_container(cri::StopContainerRequest {
        container_id: ctr_id.clone(),
        timeout: 1,
    })
    .await
    .context("StopContainer")?;
    let st = wait_state(
        &mut rt,
        &ctr_id,
        cri::ContainerState::ContainerExited,
        Duration::from_secs(10),
    )
    .await?;
    assert!(st.finished_at >= st.started_at, "{st:?}");
    remove_the_pod(&mut rt, &ctr_id, &pod_id).await?;

    let dir = ctrd.dir().to_path_buf();
    let t_stop = Instant::now();
    ctrd.stop()?;
    eprintln!("containerd stopped in {:?}", t_stop.elapsed());
    assert!(!dir.exists(), "{} still exists after stop", dir.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cni_pod_gets_ip() -> Result<()> {
    let mut ctrd = timed_containerd(true).await?;
    let subnet = ctrd.cni_subnet().context("no CNI subnet recorded")?;
    let prefix = subnet.trim_end_matches("0/24").to_string(); // "10.a.b."

    let (mut rt, _img) = cri_clients(ctrd.socket()).await?;
    let log_dir = ctrd.dir().join("pods").join("net");
    std::fs::create_dir_all(&log_dir)?;
    let sb_config = sandbox_config("net", &log_dir, false);
    let pod_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb_config),
            runtime_handler: String::new(),
        })
        .await
        .context("RunPodSandbox (CNI)")?
        .into_inner()
        .pod_sandbox_id;
    let status = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: pod_id.clone(),
            verbose: false,
        })
        .await?
        .into_inner()
        .status
        .context("PodSandboxStatus returned no status")?;
    let ip = status
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    assert!(
        ip.starts_with(&prefix),
        "pod IP {ip:?} not in {subnet}: {status:?}"
    );
    assert_eq!(
        status.state,
        cri::PodSandboxState::SandboxReady as i32,
        "{status:?}"
    );

    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod_id.clone(),
    })
    .await?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod_id,
    })
    .await?;
    ctrd.stop()?;
    Ok(())
}

/// Everything of `dir` that could outlive a stop: processes mentioning it,
/// mounts under it, and (with CNI) the bridge and iptables rules.
fn leftovers(dir: &Path, cni_env: Option<&str>) -> Vec<String> {
    let dir_s = dir.display().to_string();
    let mut out = Vec::new();
    if dir.exists() {
        out.push(format!("directory {dir_s}"));
    }
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&dir_s) {
            out.push(format!(
                "process {}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mountinfo.lines().filter(|l| l.contains(&dir_s)) {
        out.push(format!("mount {line}"));
    }
    if let Some(env) = cni_env {
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_default()
                .to_string()
        };
        let bridge = get("CNI_BRIDGE");
        let network = get("CNI_NETWORK");
        if std::process::Command::new("ip")
            .args(["link", "show", &bridge])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
        {
            out.push(format!("bridge {bridge}"));
        }
        for table in ["nat", "filter"] {
            let rules = std::process::Command::new("iptables")
                .args(["-w", "-t", table, "-S"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_default();
            // iptables -S prints the CNI comment as: "name: \"<network>\" id: \"<id>\""
            let tag = format!("name: \\\"{network}\\\"");
            for rule in rules.lines().filter(|r| r.contains(&tag)) {
                out.push(format!("iptables -t {table} {rule}"));
            }
        }
    }
    out
}

/// Fault-test support: SIGKILL containerd with a running pod, restart it on the
/// same socket (CRI recovers the pod from the shims), then stop without
/// removing anything: stop must still clean up containers, shims, mounts, the
/// bridge and the iptables rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_hard_restart_then_stop_leaves_nothing() -> Result<()> {
    require_root();
    let mut ctrd = Containerd::start_async(ContainerdOpts { cni: true }).await?;
    let dir = ctrd.dir().to_path_buf();
    let (mut rt, _img) = cri_clients(ctrd.socket()).await?;
    let log_dir = dir.join("pods").join("fault");
    std::fs::create_dir_all(log_dir.join("busybox"))?;
    let mut sb_config = sandbox_config("fault", &log_dir, false);
    // A hostPort makes the portmap plugin add its per-pod and shared chains too.
    // (iptables rules only: nothing listens on it and no traffic is sent.)
    sb_config.port_mappings = vec![cri::PortMapping {
        protocol: cri::Protocol::Tcp as i32,
        container_port: 8080,
        host_port: 40000 + (std::process::id() % 10000) as i32,
        host_ip: "127.0.0.1".into(),
    }];
    let (_, ctr_id) = run_pod_with(
        &mut rt,
        &sb_config,
        container_config("busybox", BUSYBOX_IMAGE, &["sleep", "300"]),
    )
    .await?;
    let before = wait_state(
        &mut rt,
        &ctr_id,
        cri::ContainerState::ContainerRunning,
        Duration::from_secs(10),
    )
    .await?;

    let old_pid = ctrd.pid().context("containerd pid")?;
    ctrd.kill_hard()?;
    assert!(
        ctrd.pid().is_none(),
        "containerd still running after kill_hard"
    );
    assert!(
        rt.version(cri::VersionRequest::default()).await.is_err(),
        "CRI answered with containerd killed"
    );

    let t = Instant::now();
    ctrd.restart()?;
    eprintln!("restart after kill_hard took {:?}", t.elapsed());
    let new_pid = ctrd.pid().context("containerd pid after restart")?;
    assert_ne!(old_pid, new_pid);
    // The old channel reconnects to the same socket.
    let after = container_status(&mut rt, &ctr_id).await?;
    assert_eq!(
        after.state,
        cri::ContainerState::ContainerRunning as i32,
        "{after:?}"
    );
    assert_eq!(
        after.started_at, before.started_at,
        "container restarted? {after:?}"
    );

    let cni_env = std::fs::read_to_string(dir.join("cni.env")).context("cni.env")?;
    // Sanity check of the leftover detection itself while everything runs.
    let running = leftovers(&dir, Some(&cni_env)).join("\n");
    for what in ["directory", "process", "mount", "bridge", "iptables -t nat"] {
        assert!(
            running.contains(what),
            "no {what} detected while running:\n{running}"
        );
    }
    ctrd.stop()?;
    let left = leftovers(&dir, Some(&cni_env));
    assert!(
        left.is_empty(),
        "left behind after stop:\n{}",
        left.join("\n")
    );
    // The last CNI instance to stop also drops portmap's shared chains.
    if !Path::new("/run/crisp-cni").exists() {
        let nat = std::process::Command::new("iptables")
            .args(["-w", "-t", "nat", "-S"])
            .output()?;
        let nat = String::from_utf8_lossy(&nat.stdout);
        assert!(!nat.contains("CNI-HOSTPORT"), "portmap chains left:\n{nat}");
    }
    Ok(())
}
