//! Container removal, which is not part of termination (KUBELET-CRI §3.1 step 4):
//! - `podContainerDeletor`: on PLEG `ContainerDied`, remove older dead instances of that container
//!   (all of them once the pod is deleted and terminated);
//! - container GC (`ContainerGCPeriod`): evict dead containers and empty not-ready sandboxes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::journal::CallMeta;
use super::kubelet::Inner;
use super::status::{
    CriState, LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// `--maximum-dead-containers-per-container` default.
const MAX_PER_POD_CONTAINER: usize = 1;

/// (created_at, id, attribution) of an evictable container.
type Evictable = (i64, String, CallMeta);

// === impl Inner (GC) ===

impl Inner {
    /// `cleanUpContainersInPod` → `deleteContainersInPod`.
    ///
    /// Deviation: kubelet also cleans up pods it does not know (treating them as removable); the
    /// emulator only touches its own pods, so it is safe on a runtime shared with anything else.
    /// Container GC (opt-in) keeps kubelet's rule.
    pub(crate) fn clean_up_containers_in_pod(&self, uid: &str, exited_id: &str) {
        if !self.cache.contains(uid) || self.entry(uid).is_none() {
            return;
        }
        let status = self.cache.get(uid).status;
        let remove_all = self.should_pod_content_be_removed(uid);
        let keep = if remove_all { 0 } else { MAX_PER_POD_CONTAINER };
        // The died container must be one of the pod's containers (sandbox events match nothing).
        let matched = if remove_all {
            None
        } else {
            status.containers.iter().find(|c| c.id == exited_id)
        };
        if !remove_all && matched.is_none() {
            return;
        }
        // Exited instances with that name (all names when removing everything), newest first.
        let candidates: Vec<_> = status
            .containers
            .iter()
            .filter(|c| c.state == CriState::Exited)
            .filter(|c| matched.is_none_or(|m| m.name == c.name))
            .collect();
        if candidates.len() <= keep {
            return;
        }
        for c in &candidates[keep..] {
            let meta = CallMeta::pod(&status.namespace, &status.name, uid).with_container(&c.name);
            // Like kubelet, drop the request when the worker's buffer is full.
            if self.deletor_tx.try_send((c.id.clone(), meta)).is_err() {
                tracing::info!(container = %c.id, "failed to issue the request to remove container");
            }
        }
    }

    /// The `podContainerDeletor` worker.
    pub(crate) async fn container_deletor_loop(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<(String, CallMeta)>,
    ) {
        let mut stop = self.shutdown.subscribe();
        loop {
            let (id, meta) = tokio::select! {
                m = rx.recv() => match m { Some(m) => m, None => return },
                _ = stop.changed() => return,
            };
            if let Err(e) = self.rt.remove_container(&id, meta).await {
                tracing::warn!(container = %id, "failed to remove container: {}", e.message());
            }
        }
    }

    /// Container GC every `period`.
    pub(crate) async fn gc_loop(self: Arc<Self>, period: Duration) {
        let mut stop = self.shutdown.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.changed() => return,
            }
            if let Err(e) = self.garbage_collect().await {
                tracing::warn!("container garbage collection failed: {e}");
            }
        }
    }

    /// `containerGC.GarbageCollect` with kubelet's default policy (MinAge 0, MaxPerPodContainer 1,
    /// MaxContainers unlimited), all sources ready, non-deleted pods not evicted.
    pub async fn garbage_collect(&self) -> anyhow::Result<()> {
        let cri = &self.rt.cri;
        // evictContainers: non-running containers grouped by (pod uid, name), newest first.
        let containers = cri
            .list_containers(Some(Default::default()), CallMeta::default())
            .await?;
        let mut units: BTreeMap<(String, String), Vec<Evictable>> = BTreeMap::new();
        for c in &containers {
            if CriState::from_cri(c.state) == CriState::Running {
                continue;
            }
            let uid = c.labels.get(LABEL_POD_UID).cloned().unwrap_or_default();
            let name = c
                .labels
                .get(LABEL_CONTAINER_NAME)
                .cloned()
                .unwrap_or_default();
            let meta = CallMeta::pod(
                c.labels.get(LABEL_POD_NAMESPACE).map_or("", String::as_str),
                c.labels.get(LABEL_POD_NAME).map_or("", String::as_str),
                &uid,
            )
            .with_container(&name);
            units
                .entry((uid, name))
                .or_default()
                .push((c.created_at, c.id.clone(), meta));
        }
        for ((uid, _), mut list) in units {
            list.sort_by_key(|e| std::cmp::Reverse(e.0));
            let keep = if self.should_pod_content_be_removed(&uid) {
                0
            } else {
                MAX_PER_POD_CONTAINER
            };
            for (_, id, meta) in list.into_iter().skip(keep) {
                if let Err(e) = self.rt.remove_container(&id, meta).await {
                    tracing::warn!(container = %id, "GC failed to remove container: {}", e.message());
                }
            }
        }

        // evictSandboxes: not-ready sandboxes without containers; all of them for removable pods,
        // all but the newest otherwise. Stop before remove, in case.
        let containers = cri
            .list_containers(Some(Default::default()), CallMeta::default())
            .await?;
        let sandboxes = cri.list_pod_sandbox(None, CallMeta::default()).await?;
        let mut by_pod: BTreeMap<String, Vec<(i64, String, bool, CallMeta)>> = BTreeMap::new();
        for s in &sandboxes {
            let Some(md) = &s.metadata else { continue };
            let active = s.state == k8s_cri::v1::PodSandboxState::SandboxReady as i32
                || containers.iter().any(|c| c.pod_sandbox_id == s.id);
            let meta = CallMeta::pod(&md.namespace, &md.name, &md.uid);
            by_pod.entry(md.uid.clone()).or_default().push((
                s.created_at,
                s.id.clone(),
                active,
                meta,
            ));
        }
        for (uid, mut list) in by_pod {
            list.sort_by_key(|e| std::cmp::Reverse(e.0));
            let skip = if self.should_pod_content_be_removed(&uid) {
                0
            } else {
                1
            };
            for (_, id, active, meta) in list.into_iter().skip(skip) {
                if active {
                    continue;
                }
                if let Err(e) = cri.stop_pod_sandbox(&id, meta.clone()).await {
                    tracing::warn!(sandbox = %id, "GC failed to stop sandbox: {}", e.message());
                }
                if let Err(e) = cri.remove_pod_sandbox(&id, meta).await {
                    tracing::warn!(sandbox = %id, "GC failed to remove sandbox: {}", e.message());
                }
            }
        }
        Ok(())
    }
}
