//! The kubelet-facing unix socket: created with its final mode (umask around bind; no window in
//! which a looser mode is reachable), a stale file from a dead crisp replaced, a live one refused.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::FromRawFd;
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
    let fd = bind_listen(path, mode).map_err(err)?;
    // SAFETY: `bind_listen` returns a fresh, owned, listening socket fd.
    let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    std_listener.set_nonblocking(true).map_err(err)?;
    let listener = tokio::net::UnixListener::from_std(std_listener).map_err(err)?;
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

/// Serialises the umask change in [`bind_listen`] (the umask is process-wide).
static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// socket → umask → bind → chmod → listen. The file is created with its final mode (the umask
/// masks everything else), so no looser mode ever exists: ordering chmod before listen alone is
/// not enough, because the kernel checks a connecting client's write permission on the file
/// before it looks at whether the socket listens — a client that passed the check while the
/// file still had the umask's mode could complete its connect right after `listen` (seen once
/// in thousands of non-root connects racing a start on a loaded machine). chmod then sets the
/// exact mode whatever the umask was.
fn bind_listen(path: &Path, mode: u32) -> io::Result<i32> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: plain libc calls on a fd we own; sockaddr_un is zero-initialised and the path
    // length is checked against sun_path.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let close_on_err = |e: io::Error| {
            libc::close(fd);
            e
        };
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if bytes.len() >= addr.sun_path.len() {
            return Err(close_on_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "socket path too long",
            )));
        }
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        let bound = {
            let _one = UMASK.lock().unwrap_or_else(|e| e.into_inner());
            let old = libc::umask(!(mode as libc::mode_t) & 0o777);
            let r = libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len);
            libc::umask(old);
            r
        };
        if bound != 0 {
            return Err(close_on_err(io::Error::last_os_error()));
        }
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
            let _ = std::fs::remove_file(path);
            return Err(close_on_err(e));
        }
        if libc::listen(fd, 1024) != 0 {
            let _ = std::fs::remove_file(path);
            return Err(close_on_err(io::Error::last_os_error()));
        }
        Ok(fd)
    }
}

/// Takes over an already-listening socket (e.g. handed over by systemd), as an owned listener.
pub fn from_fd(fd: i32) -> io::Result<tokio::net::UnixListener> {
    // SAFETY: the caller passes a listening unix socket fd it owns.
    let l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
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
