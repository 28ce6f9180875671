//! Job mode's status patch (DESIGN.md §5): a sidecar crisp terminated reports exit code 0 and
//! reason `Completed` in ContainerStatus, PodSandboxStatus and GetContainerEvents answers, so the
//! pod is judged by its apps alone. The embedded status carries the container's id; the request
//! is read only for its id, to let the response of any other pod stream through uncollected
//! (`Engine::wants_response`, DESIGN.md §5.2); nothing is decoded while crisp has terminated no
//! sidecar.

use bytes::Bytes;

use super::Engine;
use crate::cri::patch;

impl Engine {
    /// `msg` with each container status embedded at `field` that crisp terminated patched to
    /// `exit 0, Completed`; `None`: forward it unchanged.
    pub(super) fn patch_statuses(&self, msg: &[u8], field: u32) -> Option<Bytes> {
        if self.terminated.is_empty() {
            return None;
        }
        let completed = patch::completed_fragment();
        match patch::patch_embedded(msg, field, &completed, |id| self.terminated.contains(id)) {
            Ok(patched) => patched,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot walk a status response to patch it; forwarding it unchanged"
                );
                None
            }
        }
    }
}
