//! A kubelet 1.23–1.27 emulator that drives the CRI the way kubelet does, so end-to-end tests can
//! put crisp between it and a real containerd. docs/KUBELET-CRI.md is the source of truth; comments
//! cite its sections by number, e.g. `KUBELET-CRI §1.3`.
//!
//! Where a call enters and in what order:
//! - [`Kubelet::add_pod`] → a pod worker (`worker.rs`, one task per pod, serial) runs `syncPod`:
//!   status, then the runtime's `SyncPod` (`runtime.rs`): RunPodSandbox → PodSandboxStatus → one
//!   init container per sync → regular containers one by one (ImageStatus → \[PullImage\] →
//!   ImageStatus → CreateContainer → StartContainer → postStart ExecSync).
//! - The PLEG (`pleg.rs`, in `kubelet.rs`'s loop) relists every second, refreshes the pod cache
//!   (`cache.rs`) with `GetPodStatus`, and turns Started/Died into new syncs. Every sync waits for a
//!   cache refresh newer than its previous run.
//! - A failed sync is requeued after 10–15 s (1–1.5 s for "network is not ready"), a good one
//!   after the resync interval; events arriving meanwhile run as soon as the current sync returns.
//! - [`Kubelet::delete_pod`] → after the current sync: preStop + StopContainer for every RUNNING
//!   container in parallel, then StopPodSandbox for every sandbox, then a fresh GetPodStatus that
//!   must show nothing running (retried after 10–15 s otherwise).
//! - Every CRI call goes through [`CriClient`] (`cri.rs`) with kubelet's deadline and lands in the
//!   [`Journal`].
//!
//! ```no_run
//! # async fn demo(sock: &std::path::Path, logs: &std::path::Path) -> anyhow::Result<()> {
//! use crisp_e2e::emulator::{ContainerSpec, Kubelet, KubeletConfig, PodPhase, PodSpec};
//! use std::time::Duration;
//! let kubelet = Kubelet::new(KubeletConfig::fast(sock, logs)).await?;
//! let mut pod = PodSpec::new("web", vec![ContainerSpec::sh("app", "sleep 3600")]);
//! pod.host_network = true;
//! let uid = kubelet.add_pod(pod)?;
//! kubelet.wait_phase(&uid, PodPhase::Running, Duration::from_secs(10)).await?;
//! kubelet.delete_pod(&uid, Some(5))?;
//! kubelet.wait_terminated(&uid, Duration::from_secs(20)).await?;
//! for call in kubelet.journal().pod_calls(&uid) {
//!     println!("{}", kubelet.journal().format_record(&call));
//! }
//! # Ok(()) }
//! ```

mod backoff;
mod cache;
mod config;
mod cri;
mod gc;
mod journal;
mod kubelet;
mod pleg;
mod pod;
mod rand;
mod runtime;
mod status;
pub mod testing;
mod worker;

pub use backoff::Backoff;
pub use config::{parse_duration, KubeletConfig, KubeletVersion};
pub use cri::{
    connect_uds, go_error, ApiVersion, CriClient, Package, Service, KUBE_RUNTIME_API_VERSION,
};
pub use journal::{CallMeta, CallRecord, Journal, JournalEvent};
pub use kubelet::{rfc3339_nano, Kubelet, PodView};
pub use pleg::{PlegEvent, PlegEventType};
pub use pod::{
    ContainerSpec, EnvVar, ExecAction, Handler, Lifecycle, PodSpec, PullPolicy, RestartPolicy,
    DEFAULT_IMAGE,
};
pub use runtime::{go_duration, KillReason, PodSyncResult, RunningPod, SyncAction, SyncResult};
pub use status::{
    generate_api_pod_status, get_phase, should_container_be_restarted, terminate_pod_status,
    ApiPodStatus, ContainerState, ContainerStatusView, CriState, PodPhase, ReasonCache,
    RuntimeContainerStatus, RuntimePodStatus, StatusInputs,
};
pub use tonic_prost::ProstCodec;
pub use worker::NETWORK_NOT_READY;
