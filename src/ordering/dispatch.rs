//! The engine as an [`Interceptor`]: what it asks to see of each call, and the dispatch by
//! route, to one file per gate (the table in `mod.rs`) or to the engine's caches (a sandbox
//! run or removed, a container removed). The gates decide; the caches are `mod.rs`'s.

use bytes::Bytes;

use super::Engine;
use crate::cri::tags;
use crate::cri::Rpc;
use crate::intercept::{BoxFuture, Call, Interceptor, Interest, Verdict};

impl Interceptor for Engine {
    fn interest(&self, call: &Call) -> Interest {
        match call.route.rpc {
            Some(Rpc::CreateContainer) | Some(Rpc::RunPodSandbox) => Interest {
                request: true,
                response: true,
                complete: false,
                view: false,
            },
            // The end of a stop removes its kept intent (`on_complete`).
            Some(Rpc::StopContainer) | Some(Rpc::StopPodSandbox) => Interest {
                request: true,
                response: false,
                complete: true,
                view: false,
            },
            // An app's start is gated when crisp saw no create of it (a restored pod).
            Some(Rpc::StartContainer)
            | Some(Rpc::RemovePodSandbox)
            | Some(Rpc::RemoveContainer) => Interest {
                request: true,
                response: false,
                complete: false,
                view: false,
            },
            // Job mode's exit-code patch: only while crisp has terminated some sidecar, and then
            // only for a call about a marked container or sandbox (`conditional`: the relay
            // reads the request and asks `wants_response`, DESIGN.md §5.2). Every other status
            // call stays on the relay.
            Some(Rpc::ContainerStatus) | Some(Rpc::PodSandboxStatus)
                if !self.terminated.is_empty() =>
            {
                Interest {
                    request: true,
                    response: true,
                    complete: false,
                    view: false,
                }
            }
            // Judging a refused container (see `InitGuess`): only while one waits for judgement.
            Some(Rpc::ImageStatus) | Some(Rpc::PullImage) if !self.guessing.is_empty() => {
                Interest {
                    request: true,
                    response: false,
                    complete: false,
                    view: false,
                }
            }
            // Events are rare and a stream lives long: watch every message while job mode is on.
            Some(Rpc::GetContainerEvents) if self.job.enabled => Interest {
                request: false,
                response: true,
                complete: false,
                view: false,
            },
            _ => Interest::NONE,
        }
    }

    fn on_request<'a>(&'a self, call: &'a Call, msg: &'a [u8]) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            match call.route.rpc {
                Some(Rpc::CreateContainer) => self.gate_create(call, msg).await,
                Some(Rpc::StartContainer) => self.gate_start(call, msg).await,
                Some(Rpc::StopContainer) => self.gate_stop(call, msg).await,
                Some(Rpc::StopPodSandbox) => self.gate_stop_sandbox(call, msg).await,
                Some(Rpc::RemovePodSandbox) => {
                    self.forget_sandbox(msg);
                    Verdict::Forward
                }
                Some(Rpc::ImageStatus) => {
                    self.on_image_status(msg);
                    Verdict::Forward
                }
                Some(Rpc::PullImage) => {
                    self.on_pull_image(msg);
                    Verdict::Forward
                }
                Some(Rpc::RemoveContainer) => {
                    self.forget_container(msg);
                    Verdict::Forward
                }
                _ => Verdict::Forward,
            }
        })
    }

    /// A status call's response is collected and walked only when it can carry a terminated
    /// sidecar: a ContainerStatus of a marked container, a PodSandboxStatus of a sandbox with
    /// one. The id is read in place (no allocation); a request that does not show one keeps
    /// the response (it is patched as before, or forwarded as is).
    fn wants_response(&self, call: &Call, req: &[u8]) -> bool {
        let id = || crate::cri::patch::string_field(req, 1);
        match call.route.rpc {
            Some(Rpc::ContainerStatus) => id().is_none_or(|id| self.terminated.contains(id)),
            Some(Rpc::PodSandboxStatus) => {
                id().is_none_or(|id| self.terminated.may_have_sandbox(id))
            }
            _ => true,
        }
    }

    /// The status calls' interest is for the marked containers' and sandboxes' only.
    fn conditional(&self, call: &Call) -> bool {
        matches!(
            call.route.rpc,
            Some(Rpc::ContainerStatus) | Some(Rpc::PodSandboxStatus)
        )
    }

    /// A StopContainer or StopPodSandbox answered (or ended otherwise, crisp alive): kubelet
    /// has its answer, and the call's kept intent goes.
    fn on_complete(&self, call: &Call, _outcome: &crate::intercept::Outcome) {
        if self.stop_calls.is_empty() {
            return;
        }
        if let Some((_, (key, token))) = self.stop_calls.remove(&call.id) {
            self.intents.done(&key, token);
        }
    }

    fn on_response(&self, call: &Call, req: &[u8], msg: Option<&[u8]>, code: i32) -> Option<Bytes> {
        if code != 0 {
            return None;
        }
        let msg = msg?;
        match call.route.rpc {
            Some(Rpc::ContainerStatus) => {
                self.patch_statuses(msg, tags::container_status_response::STATUS)
            }
            Some(Rpc::PodSandboxStatus) => {
                let field = tags::pod_sandbox_status_response::CONTAINERS_STATUSES;
                self.patch_statuses(msg, field)
            }
            Some(Rpc::GetContainerEvents) => {
                let field = tags::container_event_response::CONTAINERS_STATUSES;
                self.patch_statuses(msg, field)
            }
            Some(Rpc::RunPodSandbox) => {
                self.remember_sandbox(call, req, msg);
                None
            }
            Some(Rpc::CreateContainer) => {
                self.remember_created(req, msg);
                None
            }
            _ => None,
        }
    }
}
