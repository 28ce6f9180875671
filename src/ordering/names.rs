//! The engine names the ids of calls for the tap ([`PodNames`]), from its caches.

use crate::intercept::PodNames;

impl PodNames for super::Engine {
    fn names(
        &self,
        sandbox_id: Option<&str>,
        container_id: Option<&str>,
    ) -> (Option<(String, String)>, Option<(String, String)>) {
        let (pod, container) = self.lookup(sandbox_id, container_id);
        (
            pod.map(|p| (p.namespace.clone(), p.name.clone())),
            container,
        )
    }
}
