//! kubelet's pod cache (`kubecontainer.Cache`): the PLEG writes `GetPodStatus` results into it,
//! pod workers read them with `GetNewerThan`, which blocks until a relist *started* after the
//! worker's previous sync has finished (KUBELET-CRI §4.1: "each sync waits on
//! `podCache.GetNewerThan`").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::watch;

use super::status::RuntimePodStatus;

/// One cached inspection result.
#[derive(Clone, Debug)]
pub struct CacheEntry {
    /// The status (empty if the inspection failed).
    pub status: Arc<RuntimePodStatus>,
    /// The inspection error, if `GetPodStatus` failed.
    pub err: Option<String>,
    /// When the relist that produced it started.
    pub modified: Instant,
}

#[derive(Default)]
struct CacheState {
    pods: HashMap<String, CacheEntry>,
    /// Start time of the last completed relist.
    timestamp: Option<Instant>,
}

/// The pod status cache.
pub struct PodCache {
    state: Mutex<CacheState>,
    changed: watch::Sender<u64>,
}

impl Default for PodCache {
    fn default() -> Self {
        PodCache {
            state: Mutex::new(CacheState::default()),
            changed: watch::channel(0).0,
        }
    }
}

// === impl PodCache ===

impl PodCache {
    fn lock(&self) -> MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Set(uid, status, err, timestamp)`.
    pub fn set(&self, uid: &str, status: Result<RuntimePodStatus, String>, modified: Instant) {
        let entry = match status {
            Ok(s) => CacheEntry {
                status: Arc::new(s),
                err: None,
                modified,
            },
            Err(e) => CacheEntry {
                status: Arc::new(RuntimePodStatus::empty(uid)),
                err: Some(e),
                modified,
            },
        };
        self.lock().pods.insert(uid.to_string(), entry);
        self.changed.send_modify(|n| *n += 1);
    }

    /// `Delete(uid)`.
    pub fn delete(&self, uid: &str) {
        self.lock().pods.remove(uid);
        self.changed.send_modify(|n| *n += 1);
    }

    /// `UpdateTime(timestamp)`: called after every relist, once all pods are updated.
    pub fn update_time(&self, timestamp: Instant) {
        self.lock().timestamp = Some(timestamp);
        self.changed.send_modify(|n| *n += 1);
    }

    /// `Get(uid)`: a missing entry means the runtime has nothing for this pod.
    pub fn get(&self, uid: &str) -> CacheEntry {
        self.lock()
            .pods
            .get(uid)
            .cloned()
            .unwrap_or_else(|| CacheEntry {
                status: Arc::new(RuntimePodStatus::empty(uid)),
                err: None,
                modified: Instant::now(),
            })
    }

    /// Whether the runtime had anything for `uid` at the last inspection.
    pub fn contains(&self, uid: &str) -> bool {
        self.lock().pods.contains_key(uid)
    }

    fn get_if_newer_than(&self, uid: &str, min: Option<Instant>) -> Option<CacheEntry> {
        let st = self.lock();
        let global_newer = match (st.timestamp, min) {
            (Some(_), None) => true,
            (Some(t), Some(m)) => t > m,
            (None, _) => false,
        };
        match st.pods.get(uid) {
            None if global_newer => Some(CacheEntry {
                status: Arc::new(RuntimePodStatus::empty(uid)),
                err: None,
                modified: Instant::now(),
            }),
            Some(d) if global_newer || min.is_none_or(|m| d.modified > m) => Some(d.clone()),
            _ => None,
        }
    }

    /// `GetNewerThan(uid, minTime)`: waits until the pod's entry or the global timestamp is newer
    /// than `min` (`None` = the zero time).
    pub async fn get_newer_than(&self, uid: &str, min: Option<Instant>) -> CacheEntry {
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(e) = self.get_if_newer_than(uid, min) {
                return e;
            }
            // The sender lives in `self`; it cannot close while we borrow it.
            if rx.changed().await.is_err() {
                return self.get(uid);
            }
        }
    }
}
