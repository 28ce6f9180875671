//! The kubelet-facing unix socket: created with its final mode (umask around bind; no window in
//! which a looser mode is reachable), a stale file from a dead crisp replaced, a live one refused.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::time::Sleep;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("another process is already serving {0}; refusing to replace a live socket")]
    InUse(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// Removes the socket file on drop, unless another process has replaced it meanwhile.
pub struct SocketFileGuard {
    path: PathBuf,
    ino: Option<u64>,
}

impl Drop for SocketFileGuard {
    fn drop(&mut self) {
        remove_if_ours(&self.path, self.ino);
    }
}

fn remove_if_ours(path: &Path, ino: Option<u64>) {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(md), Some(ino)) = (std::fs::symlink_metadata(path), ino) {
        if md.ino() == ino {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds and listens on `path` with `mode`, creating the parent directory (0755) if needed.
pub async fn bind(
    path: &Path,
    mode: u32,
) -> Result<(tokio::net::UnixListener, SocketFileGuard), BindError> {
    let err = |source| BindError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
    }
    if std::fs::symlink_metadata(path).is_ok() {
        // A connectable socket means a live crisp (or something else) owns it.
        match tokio::time::timeout(Duration::from_secs(1), UnixStream::connect(path)).await {
            Ok(Ok(_)) => return Err(BindError::InUse(path.to_path_buf())),
            _ => {
                tracing::info!(path = %path.display(), "replacing a stale socket file");
                std::fs::remove_file(path).map_err(err)?;
            }
        }
    }
    // Created with its final mode: crate::sys::socket::bind_listen_unix says why and how.
    let fd = crate::sys::socket::bind_listen_unix(path, mode).map_err(err)?;
    let listener = from_fd(fd).map_err(err)?;
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::symlink_metadata(path).ok().map(|m| m.ino());
    Ok((
        listener,
        SocketFileGuard {
            path: path.to_path_buf(),
            ino,
        },
    ))
}

/// Takes over a listening unix stream socket (e.g. handed over by systemd) for tokio.
pub fn from_fd(fd: OwnedFd) -> io::Result<tokio::net::UnixListener> {
    let l = std::os::unix::net::UnixListener::from(fd);
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}

/// Closes a client connection that has not sent the HTTP/2 preface and first frame header within
/// the timeout (random bytes, an HTTP/1 client that waits for us, a stalled connect). After the
/// handshake, HTTP/2 keep-alive pings take over.
pub struct PrefaceTimeout {
    inner: UnixStream,
    deadline: Option<Pin<Box<Sleep>>>,
    read: usize,
}

/// 24-byte client preface + 9-byte SETTINGS frame header.
const PREFACE_BYTES: usize = 33;

impl PrefaceTimeout {
    pub fn new(inner: UnixStream, timeout: Duration) -> Self {
        PrefaceTimeout {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            read: 0,
        }
    }
}

impl AsyncRead for PrefaceTimeout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.deadline.is_some() {
            if let Poll::Ready(Ok(())) = res {
                self.read += buf.filled().len() - before;
                if self.read >= PREFACE_BYTES {
                    self.deadline = None;
                }
                return res;
            }
            if let Some(d) = self.deadline.as_mut() {
                if d.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no HTTP/2 preface from client",
                    )));
                }
            }
        }
        res
    }
}

use std::future::Future;

impl AsyncWrite for PrefaceTimeout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
