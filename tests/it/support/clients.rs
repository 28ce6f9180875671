//! Clients: tonic over a unix socket, and raw HTTP/2 (the h2 crate) for byte-level tests.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use super::*;

/// Connects tonic to a unix socket.
#[derive(Clone)]
pub struct UdsConnector(pub PathBuf);

impl tonic::codegen::Service<Uri> for UdsConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<UnixStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(TokioIo::new(UnixStream::connect(path).await?)) })
    }
}

/// A tonic channel (one HTTP/2 connection, like kubelet's) to a unix socket.
pub async fn channel(path: &Path) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(UdsConnector(path.to_path_buf()))
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", path.display()))
}

pub type RuntimeClient =
    k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;
pub type ImageClient =
    k8s_cri::v1::image_service_client::ImageServiceClient<tonic::transport::Channel>;

pub async fn runtime_client(path: &Path) -> RuntimeClient {
    RuntimeClient::new(channel(path).await)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

/// PullImage of `image` with registry credentials, as kubelet sends it for a private image.
pub async fn pull_with_auth(
    path: &Path,
    image: &str,
    auth: k8s_cri::v1::AuthConfig,
    sandbox_config: Option<k8s_cri::v1::PodSandboxConfig>,
) {
    let image = Some(k8s_cri::v1::ImageSpec {
        image: image.into(),
        ..Default::default()
    });
    let req = k8s_cri::v1::PullImageRequest {
        image,
        auth: Some(auth),
        sandbox_config,
    };
    ImageClient::new(channel(path).await)
        .pull_image(req)
        .await
        .unwrap_or_else(|e| panic!("PullImage: {e}"));
}

/// A request as a raw HTTP/2 client sends it.
#[derive(Clone, Debug)]
pub struct RawRequest {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl RawRequest {
    /// A gRPC call with the headers grpc-go sends.
    pub fn grpc(path: &str, msg: &[u8]) -> RawRequest {
        RawRequest {
            path: path.to_string(),
            headers: header_map(&[("content-type", b"application/grpc"), ("te", b"trailers")]),
            body: grpc_frame(msg),
            trailers: None,
        }
    }
}

/// A response as a raw HTTP/2 client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RawResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl RawResponse {
    /// The gRPC status, from the trailers or (trailers-only) the headers.
    pub fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap())
    }

    pub fn grpc_message(&self) -> Option<String> {
        let v = self
            .trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| self.headers.get("grpc-message"))?;
        Some(percent_decode(v.as_bytes()))
    }
}

fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw HTTP/2 client (the `h2` crate): sends exactly the headers, body and trailers given and
/// reports exactly what came back.
pub struct Raw {
    send: h2::client::SendRequest<Bytes>,
    conn: JoinHandle<()>,
}

pub fn h2_builder() -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(8 << 20)
        .initial_connection_window_size(32 << 20)
        .max_frame_size(1 << 20)
        .max_header_list_size(1 << 20);
    b
}

impl Raw {
    pub async fn connect(path: &Path) -> Raw {
        let io = UnixStream::connect(path)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        let (send, conn) = h2_builder()
            .handshake::<_, Bytes>(io)
            .await
            .expect("h2 handshake");
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Raw { send, conn }
    }

    /// Opens a stream: sends the headers, body and trailers; returns the response future.
    pub async fn start(
        &mut self,
        req: &RawRequest,
    ) -> Result<h2::client::ResponseFuture, h2::Error> {
        send_raw(&mut self.send, req).await
    }

    pub async fn call(&mut self, req: &RawRequest) -> Result<RawResponse, h2::Error> {
        let fut = self.start(req).await?;
        read_response(fut).await
    }
}

/// Opens a stream on `send`: sends the headers, body and trailers; returns the response future.
pub async fn send_raw(
    send: &mut h2::client::SendRequest<Bytes>,
    req: &RawRequest,
) -> Result<h2::client::ResponseFuture, h2::Error> {
    *send = send.clone().ready().await?;
    let mut r = Request::builder()
        .method(Method::POST)
        .uri(format!("http://localhost{}", req.path))
        .body(())
        .unwrap();
    *r.headers_mut() = req.headers.clone();
    let end = req.body.is_empty() && req.trailers.is_none();
    let (fut, mut stream) = send.send_request(r, end)?;
    if !req.body.is_empty() {
        stream.send_data(req.body.clone(), req.trailers.is_none())?;
    }
    if let Some(t) = &req.trailers {
        stream.send_trailers(t.clone())?;
    }
    Ok(fut)
}

pub async fn read_response(fut: h2::client::ResponseFuture) -> Result<RawResponse, h2::Error> {
    let resp = fut.await?;
    let (parts, mut body) = resp.into_parts();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?;
    Ok(RawResponse {
        status: parts.status,
        headers: parts.headers,
        body: data.freeze(),
        trailers,
    })
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// Reads `sock` until the peer closes it (EOF or reset). Returns what was read before.
pub async fn read_until_closed(sock: &mut UnixStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf).await {
            Ok(0) => return seen,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionReset
                    || e.kind() == io::ErrorKind::BrokenPipe =>
            {
                return seen
            }
            Err(e) => panic!("unexpected read error: {e}"),
        }
    }
}

/// Opens a GetContainerEvents stream through crisp at `crisp` to `fake`. Returns the client, the
/// stream, and the fake's sender for the stream's frames.
pub async fn open_events(
    crisp: &Path,
    fake: &Fake,
) -> (
    RuntimeClient,
    tonic::Streaming<k8s_cri::v1::ContainerEventResponse>,
    tokio::sync::mpsc::UnboundedSender<http_body::Frame<Bytes>>,
) {
    let (reply, tx) = Reply::channel(grpc_headers());
    fake.reply_once("/runtime.v1.RuntimeService/GetContainerEvents", reply);
    let mut client = runtime_client(crisp).await;
    let stream = within(
        PATIENCE,
        "stream headers",
        client.get_container_events(k8s_cri::v1::GetEventsRequest::default()),
    )
    .await
    .unwrap()
    .into_inner();
    (client, stream, tx)
}

/// Subscribes to the tap on crisp's admin socket at `admin`.
pub async fn tap_events(
    admin: &Path,
    req: crisp::admin_api::TapRequest,
) -> tonic::Streaming<crisp::admin_api::TapEvent> {
    let mut client = crisp::cli::client::connect(admin).await.unwrap();
    client.tap(req).await.unwrap().into_inner()
}
