//! Entering a pod's network namespace to open a probe's socket there (issue #19): `127.0.0.1`
//! in a pod's readiness spec is the pod's loopback, never the node's.
//!
//! Where the namespace is comes from what the runtime reports, not from runtime internals:
//! the verbose PodSandboxStatus `info` JSON (containerd's and CRI-O's shape) names the sandbox's
//! network namespace path in its OCI spec and the sandbox's pid (`/proc/PID/ns/net`); both are
//! tried ([`candidates`]).
//!
//! A [`NetNs`] holds the namespace file open: the descriptor pins that very namespace, so a
//! reused pid or a re-mounted path cannot point a cached namespace elsewhere. Sockets are made
//! inside it on a short-lived thread of their own ([`NetNs::socket`]): the thread enters the
//! namespace, creates the non-blocking socket and ends. No thread of crisp's runtime ever
//! enters a foreign namespace; the socket keeps the namespace it was made in, and tokio drives
//! it as any other.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio::net::TcpSocket;

/// `NS_GET_NSTYPE` (linux/nsfs.h: `_IO(0xb7, 0x3)`): the type of namespace a file refers to.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// One network namespace, held open.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    ino: u64,
    /// Where it was found (for log lines and for [`NetNs::moved`]).
    path: PathBuf,
}

impl NetNs {
    /// Opens `path` and checks that it is a network namespace.
    pub fn open(path: &Path) -> io::Result<NetNs> {
        let file = File::open(path)?;
        // SAFETY: ioctl on a descriptor we own, no argument.
        let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
        if kind < 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a namespace file ({})", path.display(), io::Error::last_os_error())));
        }
        if kind != libc::CLONE_NEWNET {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a network namespace", path.display())));
        }
        let ino = file.metadata()?.ino();
        Ok(NetNs { file, ino, path: path.to_path_buf() })
    }

    /// The namespace's inode number (its identity, as `ls -l /proc/PID/ns/net` shows it).
    pub fn inode(&self) -> u64 {
        self.ino
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path it was found at no longer names this namespace (the sandbox is gone, its pid
    /// reused): whoever caches it should look again.
    pub fn moved(&self) -> bool {
        std::fs::metadata(&self.path).map(|m| m.ino() != self.ino).unwrap_or(true)
    }

    /// A non-blocking TCP socket created inside this namespace, for an IPv6 or IPv4 peer.
    /// Made on a thread of its own that ends right after (never a pooled thread).
    pub async fn socket(&self, v6: bool) -> io::Result<TcpSocket> {
        let ns = self.file.try_clone()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new().name("crisp-netns".into()).spawn(move || {
            let r = enter(&ns).and_then(|()| if v6 { TcpSocket::new_v6() } else { TcpSocket::new_v4() });
            let _ = tx.send(r);
            // The thread ends here, still inside the pod's namespace: nothing else runs on it.
        })?;
        rx.await.map_err(|_| io::Error::other("the namespace thread ended without an answer"))?
    }
}

/// Moves the calling thread into the namespace `ns`.
fn enter(ns: &File) -> io::Result<()> {
    // SAFETY: setns on a descriptor we own; it affects the calling thread only (net namespaces
    // may be entered by one thread of a multi-threaded process).
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[derive(Deserialize)]
struct Info {
    #[serde(default)]
    pid: Option<u64>,
    #[serde(default, rename = "runtimeSpec")]
    runtime_spec: Option<Spec>,
}

#[derive(Deserialize)]
struct Spec {
    #[serde(default)]
    linux: Option<Linux>,
}

#[derive(Deserialize)]
struct Linux {
    #[serde(default)]
    namespaces: Vec<Namespace>,
}

#[derive(Deserialize)]
struct Namespace {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    path: Option<String>,
}

/// Where a sandbox's network namespace may be, from the `info` JSON of a verbose
/// PodSandboxStatus (`info["info"]`): the OCI spec's network namespace path first (a bind mount
/// that lives as long as the sandbox), then `/proc/PID/ns/net` of the sandbox's pid. Nothing
/// when the JSON names neither; an error when it is not JSON at all.
pub fn candidates(info: &str) -> Result<Vec<PathBuf>, String> {
    let info: Info = serde_json::from_str(info).map_err(|e| format!("the runtime's sandbox info is not the expected JSON (line {}, column {})", e.line(), e.column()))?;
    let mut out = Vec::new();
    let spec_path = info.runtime_spec.and_then(|s| s.linux).and_then(|l| l.namespaces.into_iter().find(|n| n.kind == "network")).and_then(|n| n.path);
    if let Some(p) = spec_path.filter(|p| p.starts_with('/') && !p.contains('\0')) {
        out.push(PathBuf::from(p));
    }
    if let Some(pid) = info.pid.filter(|p| *p > 1 && *p <= u64::from(u32::MAX)) {
        out.push(PathBuf::from(format!("/proc/{pid}/ns/net")));
    }
    Ok(out)
}

/// The sandbox's network namespace from its verbose `info` JSON: the first candidate that opens
/// as a network namespace, or why none did (one sentence, for one log line).
pub fn resolve(info: Option<&str>) -> Result<NetNs, String> {
    let info = info.ok_or("the runtime's sandbox status has no `info` (not a verbose answer)")?;
    let paths = candidates(info)?;
    if paths.is_empty() {
        return Err("the runtime's sandbox info names neither a network namespace path nor a pid".into());
    }
    let mut why = Vec::new();
    for p in &paths {
        match NetNs::open(p) {
            Ok(ns) => return Ok(ns),
            Err(e) => why.push(format!("{}: {e}", p.display())),
        }
    }
    Err(why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_come_from_the_spec_then_the_pid() {
        let info = r#"{"pid":4242,"config":{"annotations":{"a":"b"}},"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}"#;
        assert_eq!(candidates(info).unwrap(), vec![PathBuf::from("/var/run/netns/cni-1"), PathBuf::from("/proc/4242/ns/net")]);
        assert_eq!(candidates(r#"{"pid":7}"#).unwrap(), vec![PathBuf::from("/proc/7/ns/net")]);
        // Pid 0 or 1, relative or missing paths: nothing to try.
        assert!(candidates(r#"{"pid":0,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"netns"}]}}}"#).unwrap().is_empty());
        assert!(candidates(r#"{"pid":1}"#).unwrap().is_empty());
        assert!(candidates("not json").is_err());
        assert!(resolve(None).is_err());
        assert!(resolve(Some("{}")).unwrap_err().contains("neither"));
    }

    #[test]
    fn only_network_namespaces_open() {
        let own = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(own.inode() > 0);
        assert!(!own.moved());
        assert!(NetNs::open(Path::new("/proc/self/ns/uts")).unwrap_err().to_string().contains("not a network namespace"));
        assert!(NetNs::open(Path::new("/proc/self/status")).unwrap_err().to_string().contains("not a namespace file"));
    }

    /// A socket made "inside" crisp's own namespace works like any other, and the thread that
    /// made it is gone.
    #[tokio::test]
    async fn a_socket_from_the_namespace_connects() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let ns = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        let s = ns.socket(false).await.unwrap();
        let _c = s.connect(addr).await.unwrap();
        let (_a, peer) = l.accept().await.unwrap();
        assert!(peer.ip().is_loopback());
    }
}
