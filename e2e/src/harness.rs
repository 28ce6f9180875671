//! Hermetic real-runtime harness: a private containerd per test, on its own
//! socket and directories, with the crisp test images already imported.
//!
//! Preconditions: root, and `hack/setup.sh` has run (containerd, runc, CNI
//! plugins, busybox-static, umoci). Images are built from the host's busybox by
//! `hack/images.sh` (cached in `$CRISP_IMAGE_CACHE`, default
//! `/var/tmp/crisp-images`); containerd is driven by `hack/containerd.sh`.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use crisp_e2e::harness::{cri_channel, Containerd, ContainerdOpts};
//! let ctrd = Containerd::start(ContainerdOpts { cni: false })?;
//! let channel = cri_channel(ctrd.socket()).await?;
//! let mut rt = k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(channel);
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use tonic::transport::{Channel, Endpoint, Uri};

/// Image with `/bin/busybox`, every applet linked, `/etc/passwd`, `/tmp`; cmd `sh`.
pub const BUSYBOX_IMAGE: &str = "crisp.test/busybox:latest";
/// Sandbox ("pause") image: sleeps forever, exits 0 on SIGTERM/SIGINT.
/// Configured as the CRI `sandbox_image`.
pub const PAUSE_IMAGE: &str = "crisp.test/pause:latest";
/// The containerd namespace the CRI plugin uses.
pub const K8S_NAMESPACE: &str = "k8s.io";

/// A shell that runs until SIGTERM and then exits 0. It prints `trap-set` once the trap is in
/// place: a SIGTERM before that kills it with 143 (in a pod's shared PID namespace the shell is
/// not init and has no shield), so a test that asserts exit 0 stops it only after
/// [`wait_log_line`] saw that line.
pub const TRAPPED_LOOP: &str = "trap 'exit 0' TERM; echo trap-set; while true; do sleep 0.1; done";

/// Waits (10 ms polls, at most `timeout`) until the container log at `path` has `needle`.
pub async fn wait_log_line(path: &Path, needle: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(needle)
    {
        if Instant::now() >= deadline {
            bail!(
                "{} has no line with {needle:?} after {timeout:?}",
                path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// How long to wait for a started containerd's CRI service (and its images) to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Repository root (parent of the `e2e` crate).
pub fn repo_root() -> PathBuf {
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR"));
    e2e.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| e2e.join(".."))
}

/// `hack/` in the repository.
pub fn hack_dir() -> PathBuf {
    repo_root().join("hack")
}

/// Where `hack/images.sh` caches the image archives.
pub fn image_cache_dir() -> PathBuf {
    std::env::var_os("CRISP_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/crisp-images"))
}

/// Whether the current process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // No libc in this crate: read the effective uid from /proc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Panics with a clear message when not running as root.
pub fn require_root() {
    if !is_root() {
        panic!(
            "this test needs root: it runs a real containerd, runc, mounts and CNI. \
             Run as root after `hack/setup.sh` (CI does)."
        );
    }
}

/// Builds (or reuses from the cache) the test image archives; returns the cache dir.
pub fn ensure_images() -> Result<PathBuf> {
    let dir = image_cache_dir();
    let script = hack_dir().join("images.sh");
    let out = run_script(Command::new(&script).arg(&dir))?;
    check(&out, &format!("{} {}", script.display(), dir.display()))?;
    Ok(dir)
}

/// Options for [`Containerd::start`].
#[derive(Clone, Debug, Default)]
pub struct ContainerdOpts {
    /// Configure pod networking: a bridge + host-local + portmap conflist with a
    /// bridge and /24 subnet unique to this instance. Without it, only
    /// host-network pods (network namespace mode NODE) can run, and the CRI
    /// `Status` reports NetworkReady=false.
    pub cni: bool,
}

/// A private containerd (CRI v1 + v1alpha2) on its own socket under a fresh
/// directory in /tmp. Stopped, with all its containers, shims, mounts and CNI
/// state, on [`Containerd::stop`] or drop. A watchdog also stops it if the test
/// process dies without dropping it (e.g. one kept in a `static`).
pub struct Containerd {
    dir: PathBuf,
    socket: PathBuf,
    opts: ContainerdOpts,
    stopped: bool,
}

impl fmt::Debug for Containerd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Containerd")
            .field("dir", &self.dir)
            .field("socket", &self.socket)
            .field("opts", &self.opts)
            .field("pid", &self.pid())
            .field("stopped", &self.stopped)
            .finish()
    }
}

impl Containerd {
    /// Builds the images if needed, starts containerd and waits until its CRI
    /// service answers and both test images are visible through CRI (and, with
    /// `cni`, the network is ready).
    ///
    /// Blocking (takes well under a second with cached images); from async code
    /// prefer [`Containerd::start_async`].
    pub fn start(opts: ContainerdOpts) -> Result<Containerd> {
        require_root();
        // hack/containerd.sh runs hack/images.sh (cached) before starting containerd.
        let dir = tempfile::Builder::new()
            .prefix("crisp-ctrd-")
            .tempdir_in("/tmp")
            .context("creating a directory for containerd under /tmp")?
            // The directory is deleted by `hack/containerd.sh stop` after it has
            // unmounted everything below it; TempDir's own recursive delete must
            // never run while mounts are still there.
            .keep();
        let socket = dir.join("containerd.sock");
        let mut ctrd = Containerd {
            dir,
            socket,
            opts,
            stopped: false,
        };
        // On any error, `ctrd` is dropped, which stops it and deletes the dir.
        ctrd.run_start()?;
        Ok(ctrd)
    }

    /// [`Containerd::start`] on a blocking thread.
    pub async fn start_async(opts: ContainerdOpts) -> Result<Containerd> {
        require_root();
        tokio::task::spawn_blocking(move || Containerd::start(opts))
            .await
            .context("containerd start task panicked")?
    }

    /// The containerd gRPC (and CRI) socket: `<dir>/containerd.sock`.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The instance directory (root, state, runc root, CNI conf, log, ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The last `lines` lines of containerd's log (for error messages).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path(), lines)
    }

    /// Options this instance was started with.
    pub fn opts(&self) -> &ContainerdOpts {
        &self.opts
    }

    /// With `cni`: the pod subnet (e.g. `10.213.17.0/24`) of this instance.
    pub fn cni_subnet(&self) -> Option<String> {
        let env = std::fs::read_to_string(self.dir.join("cni.env")).ok()?;
        env.lines()
            .find_map(|l| l.strip_prefix("CNI_SUBNET="))
            .map(str::to_string)
    }

    /// pid of the running containerd daemon, if it is running.
    pub fn pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join("containerd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let config = self.dir.join("config.toml");
        (cmdline.contains(&format!("--config {}", config.display())) && process_alive(pid))
            .then_some(pid)
    }

    /// SIGKILLs the containerd daemon only: shims and containers keep running
    /// (as after a containerd crash). Returns once the daemon is gone. Use
    /// [`Containerd::restart`] to bring it back on the same socket and state.
    pub fn kill_hard(&mut self) -> Result<()> {
        let pid = self.pid().ok_or_else(|| {
            anyhow!(
                "kill_hard: containerd in {} is not running",
                self.dir.display()
            )
        })?;
        let status = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -KILL {pid} (containerd) failed: {status}");
        }
        poll_until(Duration::from_secs(10), || !process_alive(pid))
            .with_context(|| format!("containerd pid {pid} still alive 10s after SIGKILL"))?;
        Ok(())
    }

    /// Starts containerd again on the same directory, config and socket (after
    /// [`Containerd::kill_hard`] or a crash) and waits until CRI is ready. Running
    /// shims and containers are re-attached by containerd. A no-op wait if it is
    /// still running.
    pub fn restart(&mut self) -> Result<()> {
        if self.stopped {
            bail!(
                "restart: containerd in {} was stopped (its directory is gone)",
                self.dir.display()
            );
        }
        self.run_start()
    }

    /// Stops containerd and removes everything it created: containers, shims,
    /// mounts, the CNI bridge/iptables rules, and the directory. Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        let script = hack_dir().join("containerd.sh");
        let out = run_script(Command::new(&script).arg("stop").arg(&self.dir))?;
        check(
            &out,
            &format!("{} stop {}", script.display(), self.dir.display()),
        )?;
        self.stopped = true;
        Ok(())
    }

    /// Gives image `src` a second name `dst` in the `k8s.io` namespace: with no registry, this
    /// is how an image that could not be pulled becomes present ("pullable") mid-test.
    pub fn tag_image(&self, src: &str, dst: &str) -> Result<()> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "tag", "--force", src, dst])
            .output()
            .context("running ctr images tag")?;
        check(&out, &format!("ctr images tag {src} {dst}"))
    }

    fn run_start(&mut self) -> Result<()> {
        let script = hack_dir().join("containerd.sh");
        let mut cmd = Command::new(&script);
        cmd.arg("start").arg(&self.dir);
        if self.opts.cni {
            cmd.arg("--cni");
        }
        cmd.arg("--owner-pid").arg(std::process::id().to_string());
        let out = run_script(&mut cmd)?;
        if let Err(e) = check(
            &out,
            &format!("{} start {}", script.display(), self.dir.display()),
        ) {
            return Err(e.context(format!("containerd log tail:\n{}", self.log_tail(40))));
        }
        let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if Path::new(&printed) != self.socket {
            bail!(
                "hack/containerd.sh start printed {printed:?}, expected the socket {}",
                self.socket.display()
            );
        }
        let socket = self.socket.clone();
        let cni = self.opts.cni;
        // Own thread + runtime: works whether or not the caller is inside a tokio runtime.
        let ready = std::thread::spawn(move || -> Result<()> {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("building a tokio runtime")?
                .block_on(wait_cri_ready(&socket, cni, READY_TIMEOUT))
        })
        .join()
        .map_err(|_| anyhow!("CRI readiness check panicked"))?;
        ready.with_context(|| {
            format!(
                "containerd on {} not ready; containerd log tail:\n{}",
                self.socket.display(),
                self.log_tail(40)
            )
        })
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!(
                "crisp-e2e harness: stopping containerd in {}: {e:#}",
                self.dir.display()
            );
        }
    }
}

/// A tonic channel to a gRPC server on a unix socket (the URI is a placeholder;
/// every connection goes to `socket`).
pub async fn cri_channel(socket: &Path) -> Result<Channel> {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .with_context(|| format!("connecting to gRPC unix socket {}", socket.display()))
}

/// CRI v1 runtime and image clients on one channel to `socket`.
pub async fn cri_clients(
    socket: &Path,
) -> Result<(
    cri::runtime_service_client::RuntimeServiceClient<Channel>,
    cri::image_service_client::ImageServiceClient<Channel>,
)> {
    let ch = cri_channel(socket).await?;
    Ok((
        cri::runtime_service_client::RuntimeServiceClient::new(ch.clone()),
        cri::image_service_client::ImageServiceClient::new(ch),
    ))
}

/// The id of `image` (its `image_ref` once a container runs it), from ImageStatus.
pub async fn image_ref(
    img: &mut cri::image_service_client::ImageServiceClient<Channel>,
    image: &str,
) -> Result<String> {
    Ok(image_status(img, image).await?.id)
}

/// What the runtime's ImageStatus says of `image` (an error when it has no such image).
pub async fn image_status(
    img: &mut cri::image_service_client::ImageServiceClient<Channel>,
    image: &str,
) -> Result<cri::Image> {
    img.image_status(cri::ImageStatusRequest {
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        verbose: false,
    })
    .await
    .with_context(|| format!("ImageStatus {image}"))?
    .into_inner()
    .image
    .with_context(|| format!("ImageStatus {image}: no such image"))
}

/// The status of every container the runtime lists whose labels include all of `labels`, in
/// the runtime's order.
pub async fn labelled_statuses(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    labels: &[(&str, &str)],
) -> Result<Vec<cri::ContainerStatus>> {
    let filter = cri::ContainerFilter {
        label_selector: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let list = rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .context("ListContainers")?
        .into_inner()
        .containers;
    let mut out = Vec::new();
    for c in list {
        let st = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await
            .with_context(|| format!("ContainerStatus {}", c.id))?
            .into_inner()
            .status
            .context("empty ContainerStatus")?;
        out.push(st);
    }
    Ok(out)
}

/// Removes `container`, then stops and removes its pod `sandbox`, and fails when any sandbox is
/// left on the runtime: how a single-pod test ends.
pub async fn remove_the_pod(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    container: &str,
    sandbox: &str,
) -> Result<()> {
    rt.remove_container(cri::RemoveContainerRequest {
        container_id: container.into(),
    })
    .await
    .context("RemoveContainer")?;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.into(),
    })
    .await
    .context("StopPodSandbox")?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox.into(),
    })
    .await
    .context("RemovePodSandbox")?;
    let left = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .context("ListPodSandbox")?
        .into_inner()
        .items;
    if !left.is_empty() {
        bail!("sandboxes left: {left:?}");
    }
    Ok(())
}

/// ContainerStatus of one container (not verbose).
pub async fn container_status(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<cri::ContainerStatus> {
    rt.container_status(cri::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    })
    .await
    .with_context(|| format!("ContainerStatus {id}"))?
    .into_inner()
    .status
    .with_context(|| format!("ContainerStatus {id}: no status"))
}

/// Polls ContainerStatus (20 ms) until `pred` holds, at most `timeout`: the runtime's answer is
/// the truth.
pub async fn wait_container(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    id: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&cri::ContainerStatus) -> bool,
) -> Result<cri::ContainerStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let st = container_status(rt, id).await?;
        if pred(&st) {
            return Ok(st);
        }
        if Instant::now() >= deadline {
            bail!("container {id}: not {what} within {timeout:?}; last status: {st:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A host-network PodSandboxConfig for pod `name` (uid `<name>-uid`) in `namespace`, logging to
/// `log_dir`, with kubelet's `kubernetes.io/config.source: api` annotation; no labels.
pub fn host_network_sandbox(name: &str, namespace: &str, log_dir: &Path) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: namespace.into(),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        annotations: [("kubernetes.io/config.source".to_string(), "api".to_string())].into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A ContainerConfig for container `name` of `image` running `sh -c cmd`, logging to
/// `<name>.log`, labelled `io.kubernetes.container.name` as kubelet labels it.
pub fn shell_container(name: &str, image: &str, cmd: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        command: vec!["sh".into(), "-c".into(), cmd.into()],
        log_path: format!("{name}.log"),
        labels: [("io.kubernetes.container.name".to_string(), name.to_string())].into(),
        ..named_container(name, image)
    }
}

/// A ContainerConfig for container `name` (attempt 0) of `image`, nothing else set: what every
/// container config here starts from.
pub fn named_container(name: &str, image: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// CreateContainer `container` in sandbox `pod` (created from `sandbox`), then StartContainer:
/// the container's id.
pub async fn create_and_start(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    pod: &str,
    sandbox: &cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> Result<String> {
    let name = container
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(container),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .with_context(|| format!("CreateContainer {name}"))?
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .with_context(|| format!("StartContainer {name}"))?;
    Ok(id)
}

/// RunPodSandbox `sandbox` (the default runtime handler): the sandbox's id.
pub async fn run_pod_sandbox(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    sandbox: &cri::PodSandboxConfig,
) -> Result<String> {
    Ok(rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        })
        .await
        .context("RunPodSandbox")?
        .into_inner()
        .pod_sandbox_id)
}

/// RunPodSandbox `sandbox`, then [`create_and_start`] `container` in it: the sandbox's id and the
/// container's.
pub async fn run_pod_with(
    rt: &mut cri::runtime_service_client::RuntimeServiceClient<Channel>,
    sandbox: &cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> Result<(String, String)> {
    let pod = run_pod_sandbox(rt, sandbox).await?;
    let id = create_and_start(rt, &pod, sandbox, container).await?;
    Ok((pod, id))
}

/// Polls until the CRI service on `socket` answers `Version`, reports
/// RuntimeReady (and NetworkReady when `cni`), and shows both test images.
pub async fn wait_cri_ready(socket: &Path, cni: bool, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_err;
    loop {
        match cri_ready_once(socket, cni).await {
            Ok(()) => return Ok(()),
            Err(e) => last_err = e,
        }
        if Instant::now() >= deadline {
            return Err(last_err.context(format!(
                "CRI on {} not ready within {:?}",
                socket.display(),
                timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cri_ready_once(socket: &Path, cni: bool) -> Result<()> {
    let (mut rt, mut img) = cri_clients(socket).await?;
    rt.version(cri::VersionRequest {
        version: "v1".into(),
    })
    .await
    .context("CRI Version")?;
    let status = rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .context("CRI Status")?
        .into_inner()
        .status
        .ok_or_else(|| anyhow!("CRI Status returned no status"))?;
    let cond = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.r#type == t)
            .map(|c| c.status)
    };
    if cond("RuntimeReady") != Some(true) {
        bail!("CRI RuntimeReady is not true: {:?}", status.conditions);
    }
    if cni && cond("NetworkReady") != Some(true) {
        bail!("CRI NetworkReady is not true: {:?}", status.conditions);
    }
    for image in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
        let resp = img
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .with_context(|| format!("CRI ImageStatus {image}"))?
            .into_inner();
        if resp.image.is_none() {
            bail!("image {image} not (yet) known to CRI");
        }
    }
    Ok(())
}

// --- helpers -------------------------------------------------------------

fn run_script(cmd: &mut Command) -> Result<Output> {
    let desc = format!("{cmd:?}");
    cmd.stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {desc}"))
}

fn check(out: &Output, what: &str) -> Result<()> {
    if out.status.success() {
        return Ok(());
    }
    bail!(
        "{what} failed ({}):\n--- stderr ---\n{}--- stdout ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let all: Vec<&str> = s.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// True while `pid` exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // state is the first field after the ")" closing the command name
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .map(|state| state != "Z" && state != "X")
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("condition not met within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
