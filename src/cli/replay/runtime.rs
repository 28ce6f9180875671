//! The replay's client: unary CRI calls through tonic's [`Grpc`] client on a runtime's unix
//! socket. The request is already protobuf (re-encoded from the recording by the CRI types), so
//! the codec passes bytes through; tonic frames them, writes the gRPC headers and deadline, and
//! reads the answer and its status.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use tonic::client::Grpc;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::Status;

use super::Answer;
use crate::proxy::client::RawCodec;

/// Largest answer read (a node's ListContainers).
const MAX_ANSWER: usize = 64 << 20;

/// What kubelet's connections do not send: says who is calling in the runtime's logs.
const USER_AGENT: &str = "crisp-replay";

/// A runtime's socket, dialled.
#[derive(Clone, Debug)]
pub struct Runtime {
    channel: Channel,
}

impl Runtime {
    /// Dials `socket`.
    pub async fn connect(socket: &Path) -> Result<Runtime, tonic::transport::Error> {
        let channel = crate::cli::client::channel(socket, "http://cri-runtime").await?;
        Ok(Runtime { channel })
    }

    /// What every call starts with: `path` parsed, a client that reads answers up to
    /// [`MAX_ANSWER`], and the request with its `deadline` and crisp replay's user-agent. Err:
    /// the InvalidArgument answer for a path that is not one.
    fn start(&self, path: &str, request: Vec<u8>, deadline: Duration) -> Result<Call, Answer> {
        let started = tokio::time::Instant::now();
        let Ok(path) = PathAndQuery::from_str(path) else {
            return Err(answered(
                started,
                Some(3),
                format!("not a gRPC path: {path}"),
            ));
        };
        let grpc = Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER);
        let mut req = tonic::Request::new(Bytes::from(request));
        req.set_timeout(deadline);
        req.metadata_mut()
            .insert("user-agent", MetadataValue::from_static(USER_AGENT));
        Ok(Call {
            started,
            path,
            grpc,
            req,
        })
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
        let deadline = window.map_or(timeout, |w| w + timeout);
        let mut call = match self.start(path, request, deadline) {
            Ok(call) => call,
            Err(refused) => return (refused, 0, false),
        };
        let mut messages = 0;
        let read = async {
            ready(&mut call.grpc).await?;
            let mut stream = call
                .grpc
                .server_streaming(call.req, call.path, RawCodec)
                .await?
                .into_inner();
            while stream.message().await?.is_some() {
                messages += 1;
            }
            Ok::<(), Status>(())
        };
        let ended = tokio::time::timeout(window.unwrap_or(deadline), read).await;
        let answer = |code, message| answered(call.started, code, message);
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
    ) -> (Answer, Option<Bytes>) {
        let mut call = match self.start(path, request, timeout) {
            Ok(call) => call,
            Err(refused) => return (refused, None),
        };
        let unary = async {
            ready(&mut call.grpc).await?;
            call.grpc.unary(call.req, call.path, RawCodec).await
        };
        let ended = tokio::time::timeout(timeout, unary).await;
        let answer = |code, message| answered(call.started, code, message);
        match ended {
            Ok(Ok(resp)) => (answer(Some(0), String::new()), Some(resp.into_inner())),
            Ok(Err(status)) => (
                answer(Some(status.code() as i32), status.message().to_string()),
                None,
            ),
            Err(_) => (answer(None, format!("no answer within {timeout:?}")), None),
        }
    }
}

/// A call made ready to send by [`Runtime::start`].
struct Call {
    started: tokio::time::Instant,
    path: PathAndQuery,
    grpc: Grpc<Channel>,
    req: tonic::Request<Bytes>,
}

/// Waits until the channel can take a call.
async fn ready(grpc: &mut Grpc<Channel>) -> Result<(), Status> {
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(format!("runtime not ready: {e}")))
}

/// The answer of a call begun at `started`, as of now.
fn answered(started: tokio::time::Instant, code: Option<i32>, message: String) -> Answer {
    Answer {
        code,
        message,
        duration: started.elapsed(),
        held: Duration::ZERO,
    }
}
