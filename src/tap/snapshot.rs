//! A tap's snapshot of the runtime (issue #46): what kubelet's handshake asks — Version,
//! RuntimeConfig, Status, ImageFsInfo — asked by crisp through its own runtime client when a
//! subscriber wants it (`crisp tap -o`), and sent to that subscriber only, before any live
//! event, as call events marked `snapshot`. A recording begun after kubelet connected then
//! holds the answers a fresh kubelet's handshake needs (`crisp replay --as-runtime`).
//!
//! It runs in the subscriber's task on tokio (`admin/service.rs`), never on a relay thread or
//! the fan-out thread; at most four calls, each within the client's timeout. The answers are
//! kept as the runtime sent them and decoded and redacted by the one path a live call's are
//! ([`RawEvent::to_proto`]). A call that fails is logged and its event carries the status: a
//! snapshot never fails the tap.

use std::sync::OnceLock;

use super::*;
use crate::proxy::client::{RawCall, RuntimeClient};

impl RawEvent {
    /// One of crisp's own calls to the runtime as a tap event: call id 0 (no call of kubelet's
    /// has it), marked `snapshot`, its views built as a live call's are (the same budget and
    /// fields shown by size only), so that `full` and redaction treat it as they treat a live
    /// call of its method.
    pub(crate) fn snapshot(call: &RawCall) -> RawEvent {
        let route = Route::from_path(&call.path);
        let view = |dir, msg: &[u8]| Skim::of_framed(spec(route.rpc, dir), &wire::frame(msg));
        let (code, message, response) = match &call.answer {
            Ok(answer) => (crate::status::code::OK, None, Some(answer)),
            Err(e) => {
                let status = e.status();
                (status.code, Some(status.message), None)
            }
        };
        RawEvent {
            call_id: 0,
            start: call.start,
            route,
            path: call.path.clone(),
            duration: call.duration,
            held: Duration::ZERO,
            code: Some(code),
            message,
            ids: Ids::default(),
            request_bytes: call.request.len(),
            response_bytes: response.map_or(0, |r| r.len()),
            request: view(Dir::Request, &call.request),
            response: response.and_then(|r| view(Dir::Response, r)),
            redacted_json: OnceLock::new(),
            streamed: None,
            snapshot: true,
        }
    }
}

impl Tap {
    /// The runtime client snapshots are asked through (the daemon's; none in tests that build a
    /// tap alone). Set once.
    pub(crate) fn set_runtime(&self, client: RuntimeClient) {
        let _ = self.runtime.set(client);
    }

    /// The snapshot's events, asked now. Each failing call is logged once, with its method and
    /// error; its event carries the status. Empty when the tap has no runtime client.
    pub(crate) async fn snapshot(&self) -> Vec<RawEvent> {
        let Some(client) = self.runtime.get() else {
            tracing::debug!("tap snapshot: no runtime client");
            return Vec::new();
        };
        let calls = client.snapshot().await;
        let events: Vec<RawEvent> = calls.iter().map(RawEvent::snapshot).collect();
        for (c, ev) in calls.iter().zip(&events) {
            if let Err(e) = &c.answer {
                tracing::warn!(
                    method = ev.method(),
                    path = %c.path,
                    error = %e,
                    "tap snapshot: the runtime did not answer; the tap gets the call with its status"
                );
            }
        }
        events
    }
}
