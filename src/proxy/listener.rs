//! The kubelet-facing unix socket: created with its final mode (umask around bind; no window in
//! which a looser mode is reachable), a stale file from a dead crisp replaced, a live one refused.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixStream;

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
    bind_with_group(path, mode, None).await
}

/// [`bind`], and the socket file given to group `gid` (when set) before it listens.
pub async fn bind_with_group(
    path: &Path,
    mode: u32,
    gid: Option<u32>,
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
    let fd = crate::sys::socket::bind_listen_unix(path, mode, gid).map_err(err)?;
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
