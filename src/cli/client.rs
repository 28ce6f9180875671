//! The admin API's client, as `crisp tap`, `crisp pods` and `crisp timeline --live` use it:
//! where crisp's admin socket is, and a tonic channel over it (over any unix socket: `crisp
//! replay` dials a CRI runtime with the same).

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use crate::admin_api::admin_client::AdminClient;
use crate::config::{Config, ConfigError};

/// crisp's admin socket: `socket` if given, else `admin.socket` of the config file `config`
/// (or of the default one, or the default socket).
pub fn admin_socket(socket: Option<&Path>, config: Option<&Path>) -> Result<PathBuf, ConfigError> {
    match socket {
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(Config::load(config)?.admin_socket()),
    }
}

/// Connects tonic to a unix socket.
#[derive(Clone)]
struct UdsConnector(PathBuf);

impl tonic::codegen::Service<http::Uri> for UdsConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future =
        Pin<Box<dyn std::future::Future<Output = io::Result<TokioIo<UnixStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(TokioIo::new(UnixStream::connect(path).await?)) })
    }
}

/// An admin API client on `socket`.
pub async fn connect(
    socket: &Path,
) -> Result<AdminClient<tonic::transport::Channel>, tonic::transport::Error> {
    let channel = channel(socket, "http://crisp-admin").await?;
    Ok(AdminClient::new(channel).max_decoding_message_size(256 << 20))
}

/// A tonic channel to the gRPC server on the unix socket `socket`; `authority` is the URI tonic
/// requires (unused for dialling: the connector always dials the socket).
pub(crate) async fn channel(
    socket: &Path,
    authority: &'static str,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static(authority)
        .connect_with_connector(UdsConnector(socket.to_path_buf()))
        .await
}
