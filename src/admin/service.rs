//! The admin API's gRPC service (proto/crisp/admin/v1): who may tap, the tap's filter from a
//! request, and the service's methods.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::admin_api as pb;
use crate::tap::{Filter, Glob, Item};

use super::*;

/// The peer of an admin connection (SO_PEERCRED), attached to each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) uid: Option<u32>,
    pub(crate) pid: Option<i32>,
}

/// Only root may see secrets: `unredacted` from anyone else, or from a peer whose credentials
/// are unknown, is refused.
pub(crate) fn authorize(req: &pb::TapRequest, peer: Option<Peer>) -> Result<(), tonic::Status> {
    if !req.unredacted {
        return Ok(());
    }
    match peer.and_then(|p| p.uid) {
        Some(0) => Ok(()),
        Some(uid) => Err(tonic::Status::permission_denied(format!(
            "--unredacted is only served to root (uid 0); this client is uid {uid}"
        ))),
        None => Err(tonic::Status::permission_denied(
            "--unredacted is only served to root, and this client's uid is unknown",
        )),
    }
}

/// The subscriber filter a request asks for. `pod` may be `namespace/name`.
pub(crate) fn filter_from(req: &pb::TapRequest) -> Filter {
    let (mut namespace, mut pod) = (none_if_empty(&req.namespace), none_if_empty(&req.pod));
    if let Some((ns, name)) = req.pod.split_once('/') {
        namespace = Some(ns.to_string());
        pod = Some(name.to_string());
    }
    Filter {
        methods: req.methods.iter().map(|m| Glob::new(m)).collect(),
        namespace,
        pod,
        errors_only: req.errors_only,
        slower_than: Duration::from_millis(req.slower_than_ms),
        include_polling: req.include_polling,
        full: req.full,
        unredacted: req.unredacted,
    }
}

pub(super) fn none_if_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

pub(super) struct AdminService {
    pub(super) state: Arc<AdminState>,
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    type TapStream = ReceiverStream<Result<pb::TapEvent, tonic::Status>>;

    async fn tap(
        &self,
        req: tonic::Request<pb::TapRequest>,
    ) -> Result<tonic::Response<Self::TapStream>, tonic::Status> {
        let peer = req.extensions().get::<Peer>().copied();
        let req = req.into_inner();
        if let Err(s) = authorize(&req, peer) {
            tracing::warn!(
                uid = ?peer.and_then(|p| p.uid),
                pid = ?peer.and_then(|p| p.pid),
                "refused an unredacted tap to a non-root client"
            );
            return Err(s);
        }
        let uid = peer.and_then(|p| p.uid);
        let slot = self.state.taps.take(uid).map_err(|why| {
            tracing::warn!(uid = ?uid, pid = ?peer.and_then(|p| p.pid), "refused a tap: {why}");
            tonic::Status::resource_exhausted(why.to_string())
        })?;
        let filter = filter_from(&req);
        let (full, redact) = (filter.full, !filter.unredacted);
        if redact {
            tracing::info!(uid = ?uid, full, "tap client attached");
        } else {
            tracing::warn!(
                uid = ?uid,
                full,
                "tap client attached WITHOUT redaction: it sees registry credentials and env values"
            );
        }
        // Subscribed before the snapshot is asked: the live events from now on wait in the
        // subscription's queue (bounded, drops counted) and follow the snapshot's.
        let mut sub = self.state.tap.subscribe(filter, self.state.tap_queue);
        let tap = req.snapshot.then(|| self.state.tap.clone());
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            // Held for the tap's life: its place under the caps is given back when it ends.
            let _slot = slot;
            if let Some(tap) = tap {
                // This subscriber's alone, first; filters do not apply (it asked for them).
                let events = tokio::select! {
                    _ = tx.closed() => Vec::new(),
                    events = tap.snapshot() => events,
                };
                for ev in events {
                    let event = pb::tap_event::Event::Call(ev.to_proto(full, redact));
                    let sent = tx.send(Ok(pb::TapEvent { event: Some(event) })).await;
                    if sent.is_err() {
                        break;
                    }
                }
            }
            loop {
                let item = tokio::select! {
                    _ = tx.closed() => break,
                    item = sub.next() => item,
                };
                let Some(item) = item else { break };
                let event = match item {
                    // Decoding for `full` happens here, in this subscriber's task.
                    Item::Call(ev) => pb::tap_event::Event::Call(ev.to_proto(full, redact)),
                    Item::Hold(h) => pb::tap_event::Event::Hold(crate::tap::hold_to_proto(&h)),
                    Item::Message(m) => pb::tap_event::Event::Message(m.to_proto(full, redact)),
                    Item::Dropped { count, total } => {
                        pb::tap_event::Event::Dropped(pb::Dropped { count, total })
                    }
                };
                if tx
                    .send(Ok(pb::TapEvent { event: Some(event) }))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            tracing::info!(uid = ?uid, "tap client detached");
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    async fn list_pods(
        &self,
        req: tonic::Request<pb::ListPodsRequest>,
    ) -> Result<tonic::Response<pb::ListPodsResponse>, tonic::Status> {
        let Some(engine) = &self.state.engine else {
            return Ok(tonic::Response::new(pb::ListPodsResponse::default()));
        };
        let want = req.into_inner().pod;
        let want = (!want.is_empty()).then_some(want.as_str());
        let pods = list_pods(engine, want).await;
        Ok(tonic::Response::new(pb::ListPodsResponse { pods }))
    }

    async fn version(
        &self,
        _req: tonic::Request<pb::VersionRequest>,
    ) -> Result<tonic::Response<pb::VersionResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::VersionResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            listen: self.state.listen.display().to_string(),
            upstream: self.state.upstream.display().to_string(),
            uptime_seconds: self.state.started.elapsed().as_secs(),
            tap_subscribers: self.state.tap.subscribers() as u32,
        }))
    }
}
