//! The full end-to-end stack: a private containerd, crisp in front of it, and the kubelet
//! emulator talking to crisp — what a node looks like with crisp installed.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_cri::v1 as cri;

use crate::crisp::{Crisp, CrispOpts};
use crate::emulator::{connect_uds, Kubelet, KubeletConfig};
use crate::harness::{Containerd, ContainerdOpts};

/// Fields are dropped in order: kubelet first, then crisp, then containerd.
pub struct Stack {
    pub kubelet: Kubelet,
    pub crisp: Crisp,
    pub containerd: Containerd,
    pub dir: tempfile::TempDir,
}

impl Stack {
    /// Starts containerd (`cni`: pod networking, else host network only), crisp with
    /// `crisp_config` appended to its config, and a kubelet (fast test periods, tuned by `tune`).
    pub async fn start(cni: bool, crisp_config: &str, tune: impl FnOnce(&mut KubeletConfig)) -> Result<Stack> {
        crate::harness::require_root();
        let containerd = Containerd::start_async(ContainerdOpts { cni }).await.context("starting containerd")?;
        let crisp = Crisp::start(containerd.socket(), CrispOpts { extra_config: crisp_config.to_string(), log_level: None })?;
        let dir = tempfile::Builder::new().prefix("crisp-stack-").tempdir()?;
        let mut cfg = KubeletConfig::fast(crisp.socket(), dir.path().join("pods"));
        cfg.root_dir = Some(dir.path().join("kubelet"));
        // Keep a deleted pod's dead containers: the assertions read their finished_at.
        cfg.container_deletor = false;
        tune(&mut cfg);
        let kubelet = Kubelet::new(cfg).await.context("starting the kubelet emulator")?;
        Ok(Stack { kubelet, crisp, containerd, dir })
    }

    /// A CRI client straight to containerd (not through crisp): the runtime's own view.
    pub async fn direct(&self) -> Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>> {
        Ok(cri::runtime_service_client::RuntimeServiceClient::new(connect_uds(self.containerd.socket()).await?))
    }

    /// A CRI client through crisp.
    pub async fn via_crisp(&self) -> Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>> {
        Ok(cri::runtime_service_client::RuntimeServiceClient::new(connect_uds(self.crisp.socket()).await?))
    }

    /// Every instance of container `name` of pod `uid`, straight from containerd, oldest first.
    pub async fn instances(&self, uid: &str, name: &str) -> Result<Vec<cri::ContainerStatus>> {
        let mut rt = self.direct().await?;
        let filter = cri::ContainerFilter {
            label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string()), ("io.kubernetes.container.name".to_string(), name.to_string())].into(),
            ..Default::default()
        };
        let list = rt.list_containers(cri::ListContainersRequest { filter: Some(filter) }).await?.into_inner().containers;
        let mut out = Vec::new();
        for c in list {
            let st = rt.container_status(cri::ContainerStatusRequest { container_id: c.id.clone(), verbose: false }).await?.into_inner().status.context("empty status")?;
            out.push(st);
        }
        out.sort_by_key(|s| s.created_at);
        Ok(out)
    }

    /// The newest instance of container `name`, straight from containerd.
    pub async fn status(&self, uid: &str, name: &str) -> Result<cri::ContainerStatus> {
        self.instances(uid, name).await?.pop().with_context(|| format!("no container {name} in pod {uid}"))
    }

    /// Waits until containerd reports container `name` EXITED.
    pub async fn wait_exited(&self, uid: &str, name: &str, timeout: Duration) -> Result<cri::ContainerStatus> {
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

    /// Prints the pod's CRI calls (as the kubelet saw them) and crisp's log: for failing tests.
    pub fn dump(&self, uid: &str) {
        let j = self.kubelet.journal();
        for r in j.pod_calls(uid).iter().filter(|r| !r.is_polling()) {
            eprintln!("{}", j.format_record(r));
        }
        eprintln!("--- crisp log ---\n{}", self.crisp.log_text());
    }
}

/// ns → seconds, for messages.
pub fn secs(ns: i64) -> f64 {
    ns as f64 / 1e9
}
