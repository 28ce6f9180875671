//! crisp's own calls whose answer is kept as the runtime sent it, never decoded here: the tap's
//! snapshot of the runtime when a recording starts (issue #46, docs/TAP.md) — Version,
//! RuntimeConfig, Status and ImageFsInfo, what kubelet asks in its handshake. The tap decodes
//! and redacts the bytes as it does a live call's (`tap::decode`), unknown fields included,
//! which a typed answer would have dropped.

use std::time::{Duration, Instant, SystemTime};

use bytes::{BufMut, Bytes};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::pool_service::Runtime;
use super::{
    method_path, unary_with, ClientError, OwnCall, RuntimeClient, Service, VersionRequest,
};
use crate::cri::ApiVersion;

/// One of crisp's own calls, as the tap shows it: its path, the request crisp sent, when it
/// started and how long it took, and the answer's message as it came (or why there is none).
#[derive(Debug)]
pub(crate) struct RawCall {
    pub(crate) path: String,
    pub(crate) request: Bytes,
    pub(crate) start: SystemTime,
    pub(crate) duration: Duration,
    pub(crate) answer: Result<Bytes, ClientError>,
}

impl RuntimeClient {
    /// What kubelet's handshake asks the runtime (Version, RuntimeConfig, Status, ImageFsInfo),
    /// asked now, each within the client's timeout and read limit. Version first, in runtime.v1,
    /// then in runtime.v1alpha2 if the runtime has no v1 (as kubelet negotiates); the other three
    /// together, in the version that answered. A call that fails is in the list with its error.
    pub(crate) async fn snapshot(&self) -> Vec<RawCall> {
        snapshot(self.pool.clone(), self.timeout).await
    }
}

pub(super) async fn snapshot<R: Runtime>(runtime: R, timeout: Duration) -> Vec<RawCall> {
    let version_of = |v: ApiVersion| {
        let req = VersionRequest {
            version: v.as_str().to_string(),
        };
        Bytes::from(req.encode_to_vec())
    };
    let (v1, v1alpha2) = (ApiVersion::V1, ApiVersion::V1alpha2);
    let mut version = v1;
    let mut first = raw(
        &runtime,
        v1,
        Service::Runtime,
        "Version",
        version_of(v1),
        timeout,
    )
    .await;
    if first
        .answer
        .as_ref()
        .is_err_and(ClientError::is_unimplemented)
    {
        let older = raw(
            &runtime,
            v1alpha2,
            Service::Runtime,
            "Version",
            version_of(v1alpha2),
            timeout,
        )
        .await;
        if older.answer.is_ok() {
            (version, first) = (v1alpha2, older);
        }
    }
    // Empty requests: a Status's `verbose` false, as kubelet asks it.
    let (config, status, fs) = tokio::join!(
        raw(
            &runtime,
            version,
            Service::Runtime,
            "RuntimeConfig",
            Bytes::new(),
            timeout
        ),
        raw(
            &runtime,
            version,
            Service::Runtime,
            "Status",
            Bytes::new(),
            timeout
        ),
        raw(
            &runtime,
            version,
            Service::Image,
            "ImageFsInfo",
            Bytes::new(),
            timeout
        ),
    );
    vec![first, config, status, fs]
}

/// `method` of `service` asked with the encoded `request`, its answer kept as it came.
async fn raw<R: Runtime>(
    runtime: &R,
    version: ApiVersion,
    service: Service,
    method: &'static str,
    request: Bytes,
    timeout: Duration,
) -> RawCall {
    let (start, clock) = (SystemTime::now(), Instant::now());
    let call = OwnCall::new(version, method, request.clone(), timeout).of(service);
    let answer = unary_with(runtime.clone(), call, RawCodec).await;
    RawCall {
        path: method_path(version, service, method),
        request,
        start,
        duration: clock.elapsed(),
        answer,
    }
}

/// A gRPC codec of messages as bytes: the request already encoded, the answer as it came.
/// Also `crisp replay`'s, whose requests are re-encoded from the recording.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
