//! Test fixtures: a private containerd (from `crate::harness`) with an emulated kubelet on it.

use std::time::Duration;

use anyhow::Context;
use k8s_cri::v1 as cri;

use super::config::KubeletConfig;
use super::cri::connect_uds;
use super::kubelet::Kubelet;
use super::pod::{ContainerSpec, PodSpec};
use crate::harness::{Containerd, ContainerdOpts};

/// A containerd, a kubelet emulator on it, and the pod log root. Dropping it stops containerd.
pub struct Env {
    /// The kubelet.
    pub kubelet: Kubelet,
    /// The runtime (declared after the kubelet so the kubelet is dropped first).
    pub containerd: Containerd,
    /// Pod logs (and kubelet root dir) live here.
    pub dir: tempfile::TempDir,
}

impl Env {
    /// Starts containerd (host-network only) and a kubelet with [`KubeletConfig::fast`] settings,
    /// adjusted by `tune`.
    pub async fn start(tune: impl FnOnce(&mut KubeletConfig)) -> anyhow::Result<Env> {
        Env::start_with(ContainerdOpts { cni: false }, tune).await
    }

    /// Like [`Env::start`] with harness options.
    pub async fn start_with(
        opts: ContainerdOpts,
        tune: impl FnOnce(&mut KubeletConfig),
    ) -> anyhow::Result<Env> {
        let containerd = Containerd::start_async(opts)
            .await
            .context("starting containerd")?;
        let dir = tempfile::Builder::new()
            .prefix("crisp-kubelet-")
            .tempdir()
            .context("temp dir")?;
        let mut cfg = KubeletConfig::fast(containerd.socket(), dir.path().join("pods"));
        cfg.root_dir = Some(dir.path().join("kubelet"));
        tune(&mut cfg);
        let kubelet = Kubelet::new(cfg)
            .await
            .context("starting the kubelet emulator")?;
        Ok(Env {
            kubelet,
            containerd,
            dir,
        })
    }

    /// A raw CRI v1 runtime client on the same containerd, for asserting from the runtime's side.
    pub async fn runtime_client(
        &self,
    ) -> anyhow::Result<cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>>
    {
        Ok(cri::runtime_service_client::RuntimeServiceClient::new(
            connect_uds(self.containerd.socket()).await?,
        ))
    }

    /// containerd's own ContainerStatus for every container of pod `uid` (newest first).
    pub async fn containerd_statuses(
        &self,
        uid: &str,
    ) -> anyhow::Result<Vec<cri::ContainerStatus>> {
        let mut rt = self.runtime_client().await?;
        let mut out =
            crate::harness::labelled_statuses(&mut rt, &[(super::status::LABEL_POD_UID, uid)])
                .await?;
        out.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        Ok(out)
    }

    /// containerd's newest status of the container named `name` in pod `uid`.
    pub async fn containerd_status(
        &self,
        uid: &str,
        name: &str,
    ) -> anyhow::Result<cri::ContainerStatus> {
        self.containerd_statuses(uid)
            .await?
            .into_iter()
            .find(|s| s.metadata.as_ref().is_some_and(|m| m.name == name))
            .with_context(|| format!("no container {name} in pod {uid}"))
    }

    /// Prints the pod's journal (for failing tests) and containerd's log tail.
    pub fn dump(&self, uid: &str) {
        let j = self.kubelet.journal();
        for r in j.pod_calls(uid).iter().filter(|r| !r.is_polling()) {
            eprintln!("{}", j.format_record(r));
        }
        eprintln!(
            "--- containerd log tail ---\n{}",
            self.containerd.log_tail(30)
        );
    }

    /// `waited`, the outcome of waiting on pod `uid`; prints [`Env::dump`] first when it failed.
    pub fn dump_if_failed<T>(&self, uid: &str, waited: anyhow::Result<T>) -> anyhow::Result<T> {
        if waited.is_err() {
            self.dump(uid);
        }
        waited
    }
}

/// A host-network pod whose containers run `sleep` and exit 0 on SIGTERM.
pub fn sleeper_pod(name: &str, containers: &[&str]) -> PodSpec {
    let mut pod = PodSpec::new(
        name,
        containers
            .iter()
            .map(|c| ContainerSpec::sh(c, TERM_EXITS_0))
            .collect(),
    );
    pod.host_network = true;
    pod
}

/// A shell script that sleeps until SIGTERM, then exits 0 at once.
pub const TERM_EXITS_0: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// Generous per-step timeout for tests.
pub const STEP: Duration = Duration::from_secs(30);
