//! The full end-to-end stack: a private containerd, crisp in front of it, and the kubelet
//! emulator talking to crisp — what a node looks like with crisp installed.
//!
//! The emulator reaches crisp through a [`GoBridge`] by default: a grpc-go server that forwards
//! every call over a kubelet-style grpc-go client connection, so crisp sees kubelet's real
//! transport (`:authority` = socket path, BDP PINGs, HPACK indexing; KUBELET-CRI §11).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_cri::v1 as cri;

use crate::crisp::{Crisp, CrispOpts};
use crate::emulator::{connect_uds, Kubelet, KubeletConfig, PodSpec, PodView};
use crate::grpcgo::{GoBridge, GoBridgeOpts};
use crate::harness::{Containerd, ContainerdOpts};

/// Options for [`Stack::start_with`].
#[derive(Debug, Clone)]
pub struct StackOpts {
    /// Pod networking (CNI) in containerd; else host network only.
    pub cni: bool,
    /// Appended to crisp's config.
    pub crisp_config: String,
    /// Put kubelet's grpc-go transport (a [`GoBridge`]) between the emulator and crisp.
    /// Default: yes, unless `CRISP_E2E_VIA_GRPCGO=0`.
    pub via_grpcgo: bool,
    /// The bridge's options (e.g. the `:authority` it sends).
    pub grpcgo: GoBridgeOpts,
}

impl Default for StackOpts {
    fn default() -> Self {
        StackOpts {
            cni: false,
            crisp_config: String::new(),
            via_grpcgo: crate::grpcgo::via_grpcgo_default(),
            grpcgo: GoBridgeOpts::default(),
        }
    }
}

/// Fields are dropped in order: kubelet first, then its grpc-go bridge, crisp, containerd.
pub struct Stack {
    pub kubelet: Kubelet,
    /// The emulator's grpc-go transport to crisp (empty with `via_grpcgo: false`).
    pub bridges: Vec<GoBridge>,
    pub crisp: Crisp,
    pub containerd: Containerd,
    pub dir: tempfile::TempDir,
}

impl Stack {
    /// Starts containerd (`cni`: pod networking, else host network only), crisp with
    /// `crisp_config` appended to its config, and a kubelet (fast test periods, tuned by `tune`)
    /// that reaches crisp through grpc-go (see [`StackOpts::via_grpcgo`]).
    pub async fn start(
        cni: bool,
        crisp_config: &str,
        tune: impl FnOnce(&mut KubeletConfig),
    ) -> Result<Stack> {
        Stack::start_with(
            StackOpts {
                cni,
                crisp_config: crisp_config.to_string(),
                ..Default::default()
            },
            tune,
        )
        .await
    }

    /// [`Stack::start`] with every option.
    pub async fn start_with(
        opts: StackOpts,
        tune: impl FnOnce(&mut KubeletConfig),
    ) -> Result<Stack> {
        crate::harness::require_root();
        let containerd = Containerd::start_async(ContainerdOpts { cni: opts.cni })
            .await
            .context("starting containerd")?;
        let crisp = Crisp::start(
            containerd.socket(),
            CrispOpts {
                extra_config: opts.crisp_config,
                log_level: None,
            },
        )?;
        let grpcgo = opts.via_grpcgo.then_some(opts.grpcgo);
        Stack::around(containerd, crisp, grpcgo, tune).await
    }

    /// A kubelet in front of `crisp`, which forwards to `containerd`'s runtime (itself or
    /// through what the caller put between them), through kubelet's grpc-go transport with
    /// these options when `grpcgo` is given.
    pub async fn around(
        containerd: Containerd,
        crisp: Crisp,
        grpcgo: Option<GoBridgeOpts>,
        tune: impl FnOnce(&mut KubeletConfig),
    ) -> Result<Stack> {
        let dir = tempfile::Builder::new().prefix("crisp-stack-").tempdir()?;
        let mut cfg = KubeletConfig::fast(crisp.socket(), dir.path().join("pods"));
        cfg.root_dir = Some(dir.path().join("kubelet"));
        // Keep a deleted pod's dead containers: the assertions read their finished_at.
        cfg.container_deletor = false;
        tune(&mut cfg);
        let bridges = match grpcgo {
            Some(grpcgo) => crate::grpcgo::bridge_kubelet(&mut cfg, dir.path(), grpcgo)?,
            None => Vec::new(),
        };
        let kubelet = match Kubelet::new(cfg).await {
            Ok(k) => k,
            Err(e) => {
                for b in &bridges {
                    eprintln!("--- grpc-go bridge log ---\n{}", b.log_text());
                }
                return Err(e.context("starting the kubelet emulator"));
            }
        };
        Ok(Stack {
            kubelet,
            bridges,
            crisp,
            containerd,
            dir,
        })
    }

    /// The socket the emulator's runtime service talks to: the grpc-go bridge, or crisp.
    pub fn kubelet_endpoint(&self) -> &std::path::Path {
        self.bridges
            .first()
            .map(|b| b.socket())
            .unwrap_or_else(|| self.crisp.socket())
    }

    /// A CRI client straight to containerd (not through crisp): the runtime's own view.
    pub async fn direct(
        &self,
    ) -> Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>> {
        Ok(cri::runtime_service_client::RuntimeServiceClient::new(
            connect_uds(self.containerd.socket()).await?,
        ))
    }

    /// A CRI client through crisp (tonic, straight to crisp's socket; see [`Stack::via_grpcgo`]).
    pub async fn via_crisp(
        &self,
    ) -> Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>> {
        Ok(cri::runtime_service_client::RuntimeServiceClient::new(
            connect_uds(self.crisp.socket()).await?,
        ))
    }

    /// A CRI client through the emulator's grpc-go bridge to crisp (crisp directly when the
    /// stack has no bridge): crisp sees a grpc-go client.
    pub async fn via_grpcgo(
        &self,
    ) -> Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>> {
        Ok(cri::runtime_service_client::RuntimeServiceClient::new(
            connect_uds(self.kubelet_endpoint()).await?,
        ))
    }

    /// Every instance of container `name` of pod `uid`, straight from containerd, oldest first.
    pub async fn instances(&self, uid: &str, name: &str) -> Result<Vec<cri::ContainerStatus>> {
        let mut rt = self.direct().await?;
        let mut out = crate::harness::labelled_statuses(
            &mut rt,
            &[
                ("io.kubernetes.pod.uid", uid),
                ("io.kubernetes.container.name", name),
            ],
        )
        .await?;
        out.sort_by_key(|s| s.created_at);
        Ok(out)
    }

    /// The newest instance of container `name`, straight from containerd.
    pub async fn status(&self, uid: &str, name: &str) -> Result<cri::ContainerStatus> {
        self.instances(uid, name)
            .await?
            .pop()
            .with_context(|| format!("no container {name} in pod {uid}"))
    }

    /// How long after container `first` container `then` started (ns), by containerd's own
    /// `started_at` of the newest instance of each.
    pub async fn start_gap(&self, uid: &str, first: &str, then: &str) -> Result<i64> {
        Ok(self.status(uid, then).await?.started_at - self.status(uid, first).await?.started_at)
    }

    /// Waits until containerd reports container `name` EXITED.
    pub async fn wait_exited(
        &self,
        uid: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<cri::ContainerStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(st) = self.status(uid, name).await {
                if st.state == cri::ContainerState::ContainerExited as i32 {
                    return Ok(st);
                }
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("{name} did not exit within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Adds pod `spec` ([`Kubelet::add_pod`]) and waits until all its containers run
    /// ([`Stack::wait_all_running`]): its uid.
    pub async fn run_pod(&self, spec: PodSpec, timeout: Duration) -> Result<String> {
        let uid = self.kubelet.add_pod(spec)?;
        self.wait_all_running(&uid, timeout).await?;
        Ok(uid)
    }

    /// [`Kubelet::wait_all_running`]; prints [`Stack::dump`] when it fails.
    pub async fn wait_all_running(&self, uid: &str, timeout: Duration) -> Result<PodView> {
        let r = self.kubelet.wait_all_running(uid, timeout).await;
        self.dump_on_err(uid, r)
    }

    /// [`Kubelet::wait_terminated`]; prints [`Stack::dump`] when it fails.
    pub async fn wait_terminated(&self, uid: &str, timeout: Duration) -> Result<PodView> {
        let r = self.kubelet.wait_terminated(uid, timeout).await;
        self.dump_on_err(uid, r)
    }

    /// Deletes pod `uid` ([`Kubelet::delete_pod`], `grace` overriding its grace period) and
    /// waits until it has terminated ([`Stack::wait_terminated`]).
    pub async fn delete_pod(
        &self,
        uid: &str,
        grace: Option<i64>,
        timeout: Duration,
    ) -> Result<PodView> {
        self.kubelet.delete_pod(uid, grace)?;
        self.wait_terminated(uid, timeout).await
    }

    fn dump_on_err<T>(&self, uid: &str, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.dump(uid);
        }
        r
    }

    /// Prints the pod's CRI calls (as the kubelet saw them) and crisp's log: for failing tests.
    pub fn dump(&self, uid: &str) {
        let j = self.kubelet.journal();
        for r in j.pod_calls(uid).iter().filter(|r| !r.is_polling()) {
            eprintln!("{}", j.format_record(r));
        }
        eprintln!("--- crisp log ---\n{}", self.crisp.log_text());
        for b in &self.bridges {
            eprintln!(
                "--- grpc-go bridge log ({}) ---\n{}",
                b.socket().display(),
                b.log_text()
            );
        }
    }
}

/// ns → seconds, for messages.
pub fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}
