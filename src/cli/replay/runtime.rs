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
