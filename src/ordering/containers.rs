//! The engine's cache of containers: id → sandbox and name ([`ContainerRef`]), as CreateContainer
//! answers and crisp's own lookups fill it, and what RemoveContainer and RemovePodSandbox take
//! out of it. On a node of thousands of containers those removals come by the hundred (kubelet's
//! GC, a rolling restart), so each one touches only its own sandbox's entries (issue #47).

use std::collections::{HashMap, HashSet};

use dashmap::DashMap;

use super::pod::ContainerRef;

#[derive(Default)]
pub(super) struct Containers {
    by_id: DashMap<String, ContainerRef>,
    /// Sandbox id → the ids of its containers in `by_id`. A change to both maps takes this
    /// one's entry first, then `by_id`'s (never the other way round), so that the two agree.
    by_sandbox: DashMap<String, HashSet<String>>,
    /// Entries looked at by the removals, for the test that holds them to their sandbox's.
    #[cfg(test)]
    visited: std::sync::atomic::AtomicUsize,
}

impl Containers {
    #[cfg(test)]
    fn visit(&self) {
        self.visited
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(not(test))]
    fn visit(&self) {}

    pub(super) fn get(&self, id: &str) -> Option<ContainerRef> {
        self.by_id.get(id).map(|c| c.clone())
    }

    pub(super) fn insert(&self, id: String, container: ContainerRef) {
        let sandbox = container.sandbox_id.clone();
        let before = {
            let mut ids = self.by_sandbox.entry(sandbox.clone()).or_default();
            ids.insert(id.clone());
            self.by_id.insert(id.clone(), container)
        };
        // An id cached before under another sandbox (one the runtime reused) leaves that one.
        if let Some(before) = before.filter(|b| b.sandbox_id != sandbox) {
            self.unindex(&before.sandbox_id, &id);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Takes `id` out of `sandbox`'s ids, and the sandbox out of the index once it has none:
    /// whether it has none left.
    fn unindex(&self, sandbox: &str, id: &str) -> bool {
        if let Some(mut ids) = self.by_sandbox.get_mut(sandbox) {
            self.visit();
            ids.remove(id);
        }
        self.by_sandbox
            .remove_if(sandbox, |_, ids| ids.is_empty())
            .is_some()
            || !self.by_sandbox.contains_key(sandbox)
    }

    /// Takes container `id` out: what it was, and whether its sandbox has no container left in
    /// the cache. `None`: crisp had none of that id.
    pub(super) fn remove(&self, id: &str) -> Option<(ContainerRef, bool)> {
        let sandbox = self.by_id.get(id)?.sandbox_id.clone();
        let gone = {
            let ids = self.by_sandbox.get_mut(&sandbox);
            let gone = self.by_id.remove_if(id, |_, c| c.sandbox_id == sandbox);
            drop(ids);
            gone
        };
        let (_, gone) = gone?;
        let emptied = self.unindex(&sandbox, id);
        Some((gone, emptied))
    }

    /// Takes every container of `sandbox` out (the runtime removes them with it).
    pub(super) fn remove_sandbox(&self, sandbox: &str) {
        let Some((_, ids)) = self.by_sandbox.remove(sandbox) else {
            return;
        };
        for id in ids {
            self.visit();
            self.by_id.remove_if(&id, |_, c| c.sandbox_id == sandbox);
        }
    }

    /// Every container, by sandbox: sandbox id → (container id → name).
    pub(super) fn names_by_sandbox(&self) -> HashMap<String, HashMap<String, String>> {
        let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
        for c in self.by_id.iter() {
            out.entry(c.sandbox_id.clone())
                .or_default()
                .insert(c.key().clone(), c.name.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    fn container(sandbox: usize, name: &str) -> ContainerRef {
        ContainerRef {
            sandbox_id: format!("sb-{sandbox}"),
            name: name.into(),
            created_seen: true,
        }
    }

    /// A node's worth of containers (2,000 pods of four), every one removed as kubelet's GC
    /// removes them, then the sandboxes: each removal looks at its own sandbox's entries only,
    /// not at the node's. Issue #47: each RemoveContainer scanned the whole cache to tell
    /// whether its sandbox was emptied, and each RemovePodSandbox every container of the node —
    /// a node's turnover cost the square of its containers.
    #[test]
    fn removals_look_at_their_own_sandbox_only() {
        const PODS: usize = 2_000;
        const NAMES: [&str; 4] = ["init", "proxy", "app", "agent"];
        let cache = Containers::default();
        for pod in 0..PODS {
            for name in NAMES {
                cache.insert(format!("{pod}-{name}"), container(pod, name));
            }
        }
        assert_eq!(cache.len(), PODS * NAMES.len());
        // Half the pods lose their containers one by one, the other half go with their sandbox.
        for pod in 0..PODS / 2 {
            for (k, name) in NAMES.iter().enumerate() {
                let (gone, emptied) = cache.remove(&format!("{pod}-{name}")).unwrap();
                assert_eq!(gone.sandbox_id, format!("sb-{pod}"));
                assert_eq!(emptied, k == NAMES.len() - 1, "{pod}-{name}");
            }
        }
        assert!(cache.remove("0-app").is_none());
        for pod in PODS / 2..PODS {
            cache.remove_sandbox(&format!("sb-{pod}"));
        }
        assert_eq!(cache.len(), 0);
        let visited = cache.visited.load(Relaxed);
        assert!(
            visited <= 2 * PODS * NAMES.len(),
            "{visited} entries looked at to remove {} containers",
            PODS * NAMES.len()
        );
    }

    /// A container cached again under another sandbox (an id the runtime reused) leaves the
    /// first sandbox's entries.
    #[test]
    fn a_container_moves_with_its_sandbox() {
        let cache = Containers::default();
        cache.insert("c".into(), container(1, "app"));
        cache.insert("d".into(), container(1, "proxy"));
        cache.insert("c".into(), container(2, "app"));
        let (_, emptied) = cache.remove("d").unwrap();
        assert!(emptied, "sandbox 1 has no container left");
        cache.remove_sandbox("sb-1");
        assert_eq!(cache.get("c").unwrap().sandbox_id, "sb-2");
        let by_sandbox = cache.names_by_sandbox();
        assert_eq!(by_sandbox.len(), 1);
        assert_eq!(by_sandbox["sb-2"]["c"], "app");
    }
}
