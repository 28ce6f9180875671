//! The replay's client: unary CRI calls through tonic's [`Grpc`] client on a runtime's unix
//! socket. The request is already protobuf (re-encoded from the recording by the CRI types), so
//! the codec passes bytes through; tonic frames them, writes the gRPC headers and deadline, and
//! reads the answer and its status.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use bytes::{Buf, BufMut};
use http::uri::PathAndQuery;
use tonic::client::Grpc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::Status;

use super::Answer;

/// Largest answer read (a node's ListContainers).
const MAX_ANSWER: usize = 64 << 20;

/// What kubelet's connections do not send: says who is calling in the runtime's logs.
const USER_AGENT: &str = "crisp-replay";

/// A runtime's socket, dialled.
#[derive(Clone, Debug)]
pub struct Runtime {
    channel: Channel,
}

/// A message already encoded.
#[derive(Clone, Copy, Debug, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

impl Runtime {
    /// Dials `socket`.
    pub async fn connect(socket: &Path) -> Result<Runtime, tonic::transport::Error> {
        let channel = crate::cli::client::channel(socket, "http://cri-runtime").await?;
        Ok(Runtime { channel })
    }

    /// One server-streaming call of `path` with the protobuf `request`: reads its messages until
    /// it ends, or, with a `window`, until the window has passed and then cancels it (its
    /// deadline: the window and `timeout`, or `timeout`). The answer (a cancelled one:
    /// Cancelled, saying so), the messages read, and whether the replay cancelled it.
    pub(crate) async fn stream(
        &self,
        path: &str,
        request: Vec<u8>,
        timeout: Duration,
        window: Option<Duration>,
    ) -> (Answer, u64, bool) {
        let started = tokio::time::Instant::now();
        let answer = |code: Option<i32>, message: String| Answer {
            code,
            message,
            duration: started.elapsed(),
            held: Duration::ZERO,
        };
        let Ok(path) = PathAndQuery::from_str(path) else {
            return (
                answer(Some(3), format!("not a gRPC path: {path}")),
                0,
                false,
            );
        };
        let deadline = window.map_or(timeout, |w| w + timeout);
        let mut grpc = Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER);
        let mut req = tonic::Request::new(request);
        req.set_timeout(deadline);
        req.metadata_mut()
            .insert("user-agent", MetadataValue::from_static(USER_AGENT));
        let mut messages = 0;
        let read = async {
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(format!("runtime not ready: {e}")))?;
            let mut stream = grpc.server_streaming(req, path, Raw).await?.into_inner();
            while stream.message().await?.is_some() {
                messages += 1;
            }
            Ok::<(), Status>(())
        };
        let ended = tokio::time::timeout(window.unwrap_or(deadline), read).await;
        match (ended, window) {
            (Ok(Ok(())), _) => (answer(Some(0), String::new()), messages, false),
            (Ok(Err(status)), _) => (
                answer(Some(status.code() as i32), status.message().to_string()),
                messages,
                false,
            ),
            (Err(_), Some(w)) => (
                answer(
                    Some(tonic::Code::Cancelled as i32),
                    format!("cancelled by crisp replay after {w:?}"),
                ),
                messages,
                true,
            ),
            (Err(_), None) => (
                answer(None, format!("did not end within {deadline:?}")),
                messages,
                false,
            ),
        }
    }

    /// One unary call of `path` with the protobuf `request`, within `timeout` (sent as the
    /// call's deadline too). The answer's status, message and time; the response message on OK.
    pub(crate) async fn call(
        &self,
        path: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> (Answer, Option<Vec<u8>>) {
        let started = tokio::time::Instant::now();
        let answer = |code: Option<i32>, message: String| Answer {
            code,
            message,
            duration: started.elapsed(),
            held: Duration::ZERO,
        };
        let Ok(path) = PathAndQuery::from_str(path) else {
            return (answer(Some(3), format!("not a gRPC path: {path}")), None);
        };
        let mut grpc = Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER);
        let mut req = tonic::Request::new(request);
        req.set_timeout(timeout);
        req.metadata_mut()
            .insert("user-agent", MetadataValue::from_static(USER_AGENT));
        let call = async {
            grpc.ready()
                .await
                .map_err(|e| Status::unavailable(format!("runtime not ready: {e}")))?;
            grpc.unary(req, path, Raw).await
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(resp)) => (answer(Some(0), String::new()), Some(resp.into_inner())),
            Ok(Err(status)) => (
                answer(Some(status.code() as i32), status.message().to_string()),
                None,
            ),
            Err(_) => (answer(None, format!("no answer within {timeout:?}")), None),
        }
    }
}
