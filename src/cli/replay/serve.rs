//! The shell of `crisp replay --as-runtime`: a gRPC server on a unix socket that reads each
//! call, asks the [`Script`] what the recorded runtime answered, waits as long as the script
//! says, and writes that answer. HTTP/2 is hyper's; one thing is crisp's own: kubelet (grpc-go)
//! sends the socket path as `:authority`, which the h2 crate's server refuses
//! (KUBELET-CRI §11), so each connection's request header blocks pass through [`AuthorityFix`]
//! first.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::script::Script;
use crate::cri::Route;
use crate::proxy::http2::{self, hpack, Flags, Head, Kind, HEADER_LEN, PREFACE};
use crate::status::Status;
use crate::tap::decode::{decode, encode_json};
use crate::tap::redact::Dir;

/// Largest request read (a CreateContainer with a large config).
const MAX_REQUEST: usize = 16 << 20;
/// Largest HTTP/2 frame a peer may send through the authority fix.
const MAX_FRAME: usize = 1 << 20;
/// What a peer's `:authority` becomes when it is not a URI authority.
const LOCALHOST: &[u8] = b"localhost";

/// Messages of a streamed answer the shell may have ahead of the peer's reading.
const STREAM_AHEAD: usize = 16;

type Body = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;

/// Serves `script` on `listener` until `shutdown` resolves.
pub async fn serve_script(
    listener: UnixListener,
    script: Arc<Mutex<Script>>,
    shutdown: impl Future<Output = ()>,
) {
    let start = Instant::now();
    let mut conns = JoinSet::new();
    let accept = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let script = script.clone();
            conns.spawn(connection(stream, script, start));
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = shutdown => {}
    }
    conns.abort_all();
}

/// One peer connection: the authority fix in front of hyper's HTTP/2 server.
async fn connection(peer: UnixStream, script: Arc<Mutex<Script>>, start: Instant) {
    let (inner, server_side) = tokio::io::duplex(1 << 16);
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder.max_frame_size(MAX_FRAME as u32);
    let service = hyper::service::service_fn(move |req| answer(req, script.clone(), start));
    let server = builder.serve_connection(TokioIo::new(server_side), service);
    let (peer_read, mut peer_write) = peer.into_split();
    let (mut inner_read, mut inner_write) = tokio::io::split(inner);
    let up = async {
        let _ = fix_requests(peer_read, &mut inner_write).await;
        let _ = inner_write.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut inner_read, &mut peer_write).await;
        let _ = peer_write.shutdown().await;
    };
    let _ = tokio::join!(server, up, down);
}

/// Copies the peer's bytes to the server, request header blocks through [`AuthorityFix`].
async fn fix_requests(
    mut from: impl AsyncRead + Unpin,
    to: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    let mut fix = AuthorityFix::default();
    let mut head = [0u8; HEADER_LEN];
    let mut payload = Vec::new();
    loop {
        from.read_exact(&mut head).await?;
        let h = Head::parse(&head).ok_or(std::io::ErrorKind::InvalidData)?;
        if h.len > MAX_FRAME {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        payload.resize(h.len, 0);
        from.read_exact(&mut payload).await?;
        let out = fix.frame(&head, &payload);
        to.write_all(&out).await?;
    }
}

/// Rewrites a request's `:authority` that is not a URI authority (a socket path, as kubelet's
/// grpc-go sends it) to `localhost`, so that the h2 crate's server takes the call; every other
/// frame passes as it is. A header block is decoded with the peer's HPACK table and encoded
/// again without indexing (the server's table stays empty).
#[derive(Default)]
pub(crate) struct AuthorityFix {
    decoder: hpack::Decoder,
    /// A header block waiting for its CONTINUATIONs: its HEADERS frame's head, and the block.
    open: Option<(Head, Vec<u8>)>,
}

impl AuthorityFix {
    /// The bytes to pass on for one frame (`head`: its 9 bytes), in order.
    pub(crate) fn frame(&mut self, head: &[u8; HEADER_LEN], payload: &[u8]) -> Vec<u8> {
        let passthrough = || [&head[..], payload].concat();
        let Some(h) = Head::parse(head) else {
            return passthrough();
        };
        let fragment = match (h.kind, &mut self.open) {
            (Kind::Headers, None) => match http2::header_fragment(&h, payload) {
                Ok(r) => {
                    self.open = Some((h, Vec::new()));
                    &payload[r]
                }
                Err(_) => return passthrough(),
            },
            (Kind::Continuation, Some(_)) => payload,
            _ => return passthrough(),
        };
        let Some((first, block)) = self.open.as_mut() else {
            return passthrough();
        };
        block.extend_from_slice(fragment);
        if !h.has(Flags::END_HEADERS) {
            return Vec::new();
        }
        let (first, block) = (*first, std::mem::take(block));
        self.open = None;
        let mut fields = Vec::new();
        let decoded = self
            .decoder
            .decode(&block, |n, v| fields.push((n.to_vec(), v.to_vec())));
        let mut out_block = Vec::with_capacity(block.len() + 16);
        for (name, value) in &fields {
            let value: &[u8] = if name == b":authority"
                && http::uri::Authority::try_from(value.as_slice()).is_err()
            {
                LOCALHOST
            } else {
                value
            };
            http2::encode_field(&mut out_block, name, value);
        }
        if decoded.is_err() {
            // Not HPACK the server can read either: let it say so.
            out_block = block;
        }
        let mut out = Vec::with_capacity(out_block.len() + HEADER_LEN);
        http2::headers(
            &mut out,
            first.stream,
            &out_block,
            first.has(Flags::END_STREAM),
        );
        out
    }
}

/// One call: its request, the script's answer, the wait, the answer written.
async fn answer(
    req: Request<Incoming>,
    script: Arc<Mutex<Script>>,
    start: Instant,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let rpc = Route::from_path(&path).rpc;
    let body = match Limited::new(req.into_body(), MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(reply(13, &format!("reading the request: {e}"), None)),
    };
    let request = match unframe(body) {
        Some(msg) => decode(rpc, Dir::Request, &msg, true),
        None => return Ok(reply(13, "not one gRPC message", None)),
    };
    let came = Instant::now();
    let mut r = script.lock().answer(&path, &request, start.elapsed());
    if let (Some(messages), Some(index)) = (r.stream.take(), r.step) {
        return Ok(stream_reply(rpc, r, index, messages, script, came));
    }
    if !r.delay.is_zero() {
        tokio::time::sleep(r.delay).await;
    }
    let message = match (&r.response, rpc) {
        (Some(json), Some(rpc)) if r.code == 0 => Some(encode_answer(rpc, json)),
        _ if r.code == 0 => Some(Vec::new()),
        _ => None,
    };
    Ok(reply(r.code, &r.message, message))
}

/// A streamed answer: the headers at once, each recorded message at its time (`came`, the
/// call's arrival, plus its offset), then the status once the recorded duration has passed.
/// A peer that goes away ends it.
fn stream_reply(
    rpc: Option<crate::cri::Rpc>,
    r: super::script::Reply,
    index: usize,
    messages: Vec<super::script::ReplyMessage>,
    script: Arc<Mutex<Script>>,
    came: Instant,
) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_AHEAD);
    tokio::spawn(async move {
        for m in messages {
            tokio::time::sleep_until(came + m.at).await;
            let Some(rpc) = rpc else { continue };
            let frame = Frame::data(grpc_message(&encode_answer(rpc, &m.response)));
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
            script.lock().message_sent(index);
        }
        if r.open {
            // As recorded: the stream had not ended. It ends when the peer goes.
            tx.closed().await;
            return;
        }
        tokio::time::sleep_until(came + r.delay).await;
        let status = Status::new(r.code, &r.message).to_header_map();
        let _ = tx.send(Ok(Frame::trailers(status))).await;
    });
    response(rx)
}

/// The recorded response as protobuf: as recorded, or, when a redaction placeholder is not of
/// its field's type, without the placeholders (never with an invented value).
fn encode_answer(rpc: crate::cri::Rpc, json: &Value) -> Vec<u8> {
    if let Some(b) = encode_json(rpc, Dir::Response, json) {
        return b;
    }
    let mut bare = json.clone();
    strip_placeholders(&mut bare);
    encode_json(rpc, Dir::Response, &bare).unwrap_or_default()
}

fn strip_placeholders(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, x| {
                !k.starts_with('_') && !x.as_str().is_some_and(|s| s.starts_with("<redacted"))
            });
            m.values_mut().for_each(strip_placeholders);
        }
        Value::Array(items) => {
            items.retain(|x| !x.as_str().is_some_and(|s| s.starts_with("<redacted")));
            items.iter_mut().for_each(strip_placeholders);
        }
        _ => {}
    }
}

/// The message of a unary gRPC request body (uncompressed, one message).
fn unframe(mut body: Bytes) -> Option<Bytes> {
    if body.len() < 5 || body[0] != 0 {
        return None;
    }
    body.advance(1);
    let len = body.get_u32() as usize;
    (body.len() == len).then_some(body)
}

/// A gRPC length-prefixed message, uncompressed.
fn grpc_message(m: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(m.len() + 5);
    b.put_u8(0);
    b.put_u32(m.len() as u32);
    b.put_slice(m);
    b.freeze()
}

/// A gRPC response: headers, the message on OK, the status in trailers.
fn reply(code: i32, message: &str, msg: Option<Vec<u8>>) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    if let Some(m) = msg {
        let _ = tx.try_send(Ok(Frame::data(grpc_message(&m))));
    }
    let _ = tx.try_send(Ok(Frame::trailers(
        Status::new(code, message).to_header_map(),
    )));
    response(rx)
}

/// The response whose body is what `rx` gets: headers now, then the frames as they come.
fn response(rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>) -> Response<Body> {
    let mut resp = Response::new(StreamBody::new(ReceiverStream::new(rx)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_of(fields: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (n, v) in fields {
            http2::encode_field(&mut b, n, v);
        }
        b
    }

    fn decoded(frames: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let h = Head::parse(frames).expect("head");
        assert_eq!(h.kind, Kind::Headers);
        let mut out = Vec::new();
        hpack::Decoder::default()
            .decode(&frames[HEADER_LEN..HEADER_LEN + h.len], |n, v| {
                out.push((n.to_vec(), v.to_vec()))
            })
            .expect("hpack");
        out
    }

    /// kubelet's `:authority` (the socket path, or it percent-encoded) becomes `localhost`, a
    /// valid one stays, and the block may come in a HEADERS and a CONTINUATION.
    #[test]
    fn a_socket_path_authority_becomes_localhost() {
        let mut fix = AuthorityFix::default();
        for (authority, want) in [
            (&b"/run/crisp/replay.sock"[..], &b"localhost"[..]),
            (b"%2Frun%2Fcrisp.sock", b"localhost"),
            (b"cri.example:80", b"cri.example:80"),
        ] {
            let block = block_of(&[
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", b"/runtime.v1.RuntimeService/Version"),
                (b":authority", authority),
            ]);
            let (a, b) = block.split_at(block.len() / 2);
            let mut first = Vec::new();
            Head::new(Kind::Headers, Flags::NONE, http2::StreamId::new(1), a.len())
                .encode(&mut first);
            assert!(fix.frame(first[..].try_into().unwrap(), a).is_empty());
            let mut cont = Vec::new();
            Head::new(
                Kind::Continuation,
                Flags::END_HEADERS,
                http2::StreamId::new(1),
                b.len(),
            )
            .encode(&mut cont);
            let out = fix.frame(cont[..].try_into().unwrap(), b);
            let fields = decoded(&out);
            let got = fields.iter().find(|(n, _)| n == b":authority").unwrap();
            assert_eq!(got.1, want);
            assert_eq!(fields.len(), 4);
        }
        // Other frames pass untouched.
        let mut data = Vec::new();
        Head::new(Kind::Data, Flags::END_STREAM, http2::StreamId::new(1), 3).encode(&mut data);
        let out = fix.frame(data[..].try_into().unwrap(), b"abc");
        assert_eq!(out, [&data[..], b"abc"].concat());
    }

    /// A recorded answer whose redaction placeholder is not its field's type is sent without
    /// it: never with a made-up value.
    #[test]
    fn placeholders_that_do_not_encode_are_left_out() {
        let json = serde_json::json!({
            "stdout": "<redacted: 12 bytes>",
            "exit_code": 3,
        });
        let bytes = encode_answer(crate::cri::Rpc::ExecSync, &json);
        let back: crate::cri::api::ExecSyncResponse =
            prost::Message::decode(bytes.as_slice()).expect("protobuf");
        assert_eq!(back.exit_code, 3);
        assert!(back.stdout.is_empty());
    }
}
