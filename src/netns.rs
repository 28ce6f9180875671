//! Entering a pod's network namespace to open a probe's socket there (issue #19): `127.0.0.1`
//! in a pod's readiness spec is the pod's loopback, never the node's.
//!
//! Where the namespace is comes from what the runtime reports, not from runtime internals:
//! the verbose PodSandboxStatus `info` JSON (containerd's and CRI-O's shape) names the sandbox's
//! network namespace path in its OCI spec and the sandbox's pid (`/proc/PID/ns/net`); both are
//! tried ([`found`]).
//!
//! A pid is the weaker of the two: between the runtime's answer and crisp's open, the sandbox
//! may have ended and its pid been reused by any process on the node — one in the node's own
//! namespace, say. So a namespace found through `/proc/PID/ns/net` is used only if, checked
//! after it is open ([`pid_namespace_ok`]): it is not crisp's own network namespace (same
//! device and inode as `/proc/self/ns/net`), and the pid's cgroup still names the sandbox (the
//! runtime puts the sandbox's process in a cgroup named after the sandbox id: containerd's
//! `cri-containerd-ID.scope` or `…/ID`, CRI-O's `crio-ID.scope`). A pid reused before the open
//! fails the cgroup check; one reused after it cannot change the namespace already held open.
//!
//! A [`NetNs`] holds the namespace file open: the descriptor pins that very namespace, so a
//! reused pid or a re-mounted path cannot point a cached namespace elsewhere. Sockets are made
//! inside it on a short-lived thread of their own ([`NetNs::socket`]): the thread enters the
//! namespace, creates the non-blocking socket and ends. No thread of crisp's runtime ever
//! enters a foreign namespace; the socket keeps the namespace it was made in, and tokio drives
//! it as any other.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio::net::TcpSocket;

/// Why a file could not be used as a pod's network namespace.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetNsError {
    #[error("{} is not a namespace file ({source})", path.display())]
    NotANamespace { path: PathBuf, source: io::Error },
    #[error("{} is not a network namespace", path.display())]
    NotNetwork { path: PathBuf },
    /// Found through a sandbox's pid, and not the sandbox's ([`pid_namespace_ok`]).
    #[error(transparent)]
    Refused(#[from] PidRefusal),
    /// Opening or examining the file (or, through a pid, `/proc/self/ns/net` and the pid's
    /// cgroup file).
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// One network namespace, held open.
#[derive(Debug)]
pub(crate) struct NetNs {
    file: File,
    ino: u64,
    /// Where it was found (for log lines and for [`NetNs::moved`]).
    path: PathBuf,
}

impl NetNs {
    /// Opens `path` and checks that it is a network namespace.
    pub(crate) fn open(path: &Path) -> Result<NetNs, NetNsError> {
        let file = File::open(path)?;
        let kind = crate::sys::ns::kind(&file).map_err(|source| NetNsError::NotANamespace {
            path: path.to_path_buf(),
            source,
        })?;
        if kind != libc::CLONE_NEWNET {
            return Err(NetNsError::NotNetwork {
                path: path.to_path_buf(),
            });
        }
        let ino = file.metadata()?.ino();
        Ok(NetNs {
            file,
            ino,
            path: path.to_path_buf(),
        })
    }

    /// The namespace's inode number (its identity, as `ls -l /proc/PID/ns/net` shows it).
    pub(crate) fn inode(&self) -> u64 {
        self.ino
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The path it was found at no longer names this namespace (the sandbox is gone, its pid
    /// reused): whoever caches it should look again.
    pub(crate) fn moved(&self) -> bool {
        std::fs::metadata(&self.path)
            .map(|m| m.ino() != self.ino)
            .unwrap_or(true)
    }

    /// A non-blocking TCP socket created inside this namespace, for an IPv6 or IPv4 peer.
    /// Made on a thread of its own that ends right after (never a pooled thread).
    pub(crate) async fn socket(&self, v6: bool) -> io::Result<TcpSocket> {
        self.inside(move || {
            if v6 {
                TcpSocket::new_v6()
            } else {
                TcpSocket::new_v4()
            }
        })
        .await
    }

    /// Whether `ip` is an address of this namespace (issue #44: the evidence that the pod's
    /// network lives here, whatever its runtime handler): binding a socket to it inside the
    /// namespace succeeds (`EADDRNOTAVAIL`: it does not). A VM-isolated pod's host-side
    /// namespace no longer holds the pod IP (the guest does).
    pub(crate) async fn holds(&self, ip: std::net::IpAddr) -> io::Result<bool> {
        self.inside(move || match std::net::UdpSocket::bind((ip, 0)) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Ok(false),
            Err(e) => Err(e),
        })
        .await
    }

    /// Whether this is crisp's own network namespace (same device and inode as
    /// `/proc/self/ns/net`): never a pod's, unless the pod is hostNetwork.
    pub(crate) fn is_crisps_own(&self) -> io::Result<bool> {
        let own = std::fs::metadata("/proc/self/ns/net")?;
        let this = self.file.metadata()?;
        Ok(own.dev() == this.dev() && own.ino() == this.ino())
    }

    /// Runs `f` on a thread of its own that enters this namespace first and ends right after
    /// (never a pooled thread).
    async fn inside<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let ns = self.file.try_clone()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("crisp-netns".into())
            .spawn(move || {
                let r = crate::sys::ns::enter_network(&ns).and_then(|()| f());
                let _ = tx.send(r);
                // The thread ends here, still inside the pod's namespace: nothing else runs on it.
            })?;
        rx.await
            .map_err(|_| io::Error::other("the namespace thread ended without an answer"))?
    }
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

/// [`found`] without the pids: the fuzz target's entry.
#[cfg(any(test, feature = "test-util"))]
pub fn candidates(info: &str) -> Result<Vec<PathBuf>, String> {
    Ok(found(info)?.into_iter().map(|(p, _)| p).collect())
}

/// Where a sandbox's network namespace may be, from the `info` JSON of a verbose
/// PodSandboxStatus (`info["info"]`), each path with the pid it was derived from: the OCI spec's
/// network namespace path first (a bind mount that lives as long as the sandbox), then
/// `/proc/PID/ns/net` of the sandbox's pid. Nothing when the JSON names neither; an error when it
/// is not JSON at all.
fn found(info: &str) -> Result<Vec<(PathBuf, Option<u32>)>, String> {
    let info: Info = serde_json::from_str(info).map_err(|e| {
        format!(
            "the runtime's sandbox info is not the expected JSON (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    let mut out = Vec::new();
    let spec_path = info
        .runtime_spec
        .and_then(|s| s.linux)
        .and_then(|l| l.namespaces.into_iter().find(|n| n.kind == "network"))
        .and_then(|n| n.path);
    if let Some(p) = spec_path.filter(|p| p.starts_with('/') && !p.contains('\0')) {
        out.push((PathBuf::from(p), None));
    }
    if let Some(pid) = info
        .pid
        .filter(|p| *p > 1)
        .and_then(|p| u32::try_from(p).ok())
    {
        out.push((PathBuf::from(format!("/proc/{pid}/ns/net")), Some(pid)));
    }
    Ok(out)
}

/// Why a namespace found through a sandbox's pid is not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PidRefusal {
    #[error("it is crisp's own network namespace (the pid was reused, or the sandbox has no namespace of its own)")]
    OwnNamespace,
    #[error("the pid no longer belongs to the sandbox (its cgroup does not name it)")]
    NotTheSandbox,
    #[error("no sandbox id to check the pid against")]
    NoSandboxId,
}

/// Identity of a namespace file: (device, inode).
type NsId = (u64, u64);

/// Whether a namespace opened through a sandbox's pid may be used (see the module doc): it is
/// not crisp's own (`own`, from `/proc/self/ns/net`), and the pid's cgroup file, read after the
/// namespace was opened, names the sandbox.
fn pid_namespace_ok(
    own: NsId,
    target: NsId,
    cgroup: &str,
    sandbox_id: &str,
) -> Result<(), PidRefusal> {
    if target == own {
        return Err(PidRefusal::OwnNamespace);
    }
    if sandbox_id.is_empty() {
        return Err(PidRefusal::NoSandboxId);
    }
    // /proc/PID/cgroup: `hierarchy:controllers:path` per line; the sandbox id in a path.
    if !cgroup.lines().any(|l| {
        l.splitn(3, ':')
            .nth(2)
            .is_some_and(|path| path.contains(sandbox_id))
    }) {
        return Err(PidRefusal::NotTheSandbox);
    }
    Ok(())
}

/// Opens the namespace of sandbox `sandbox_id`'s pid, checked as [`pid_namespace_ok`] says.
fn open_pid_namespace(path: &Path, pid: u32, sandbox_id: &str) -> Result<NetNs, NetNsError> {
    let ns = NetNs::open(path)?;
    let id = |m: std::fs::Metadata| (m.dev(), m.ino());
    let own = id(std::fs::metadata("/proc/self/ns/net")?);
    let target = id(ns.file.metadata()?);
    // Read after the open: the cgroup of whoever has the pid now, which is who the namespace
    // held open came from, or a later process (then refused, which is safe).
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    pid_namespace_ok(own, target, &cgroup, sandbox_id)?;
    Ok(ns)
}

/// The sandbox's network namespace from its verbose `info` JSON: the first candidate that opens
/// as a network namespace (through the pid: only the sandbox's, see the module doc), or why
/// none did (one sentence, for one log line).
pub(crate) fn resolve(info: Option<&str>, sandbox_id: &str) -> Result<NetNs, String> {
    let info = info.ok_or("the runtime's sandbox status has no `info` (not a verbose answer)")?;
    let paths = found(info)?;
    if paths.is_empty() {
        return Err(
            "the runtime's sandbox info names neither a network namespace path nor a pid".into(),
        );
    }
    let mut why = Vec::new();
    for (p, pid) in &paths {
        let opened = match pid {
            Some(pid) => open_pid_namespace(p, *pid, sandbox_id),
            None => NetNs::open(p),
        };
        match opened {
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
        assert_eq!(
            candidates(info).unwrap(),
            vec![
                PathBuf::from("/var/run/netns/cni-1"),
                PathBuf::from("/proc/4242/ns/net")
            ]
        );
        assert_eq!(
            candidates(r#"{"pid":7}"#).unwrap(),
            vec![PathBuf::from("/proc/7/ns/net")]
        );
        // Pid 0 or 1, relative or missing paths: nothing to try.
        assert!(candidates(r#"{"pid":0,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"netns"}]}}}"#).unwrap().is_empty());
        assert!(candidates(r#"{"pid":1}"#).unwrap().is_empty());
        assert!(candidates("not json").is_err());
        assert!(resolve(None, "sb").is_err());
        assert!(resolve(Some("{}"), "sb").unwrap_err().contains("neither"));
    }

    /// A pid reused by a process in crisp's own namespace, or by any process outside the
    /// sandbox's cgroup, is not the sandbox's (issue #26).
    #[test]
    fn a_namespace_through_a_pid_must_be_the_sandboxes() {
        let id = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
        let systemd = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-{id}.scope\n"
        );
        let cgroupfs = format!(
            "12:pids:/kubepods/besteffort/pod1/{id}\n11:memory:/kubepods/besteffort/pod1/{id}\n"
        );
        let (own, pod) = ((4, 4026531840), (4, 4026532999));
        assert_eq!(pid_namespace_ok(own, pod, &systemd, id), Ok(()));
        assert_eq!(pid_namespace_ok(own, pod, &cgroupfs, id), Ok(()));
        assert_eq!(
            pid_namespace_ok(own, own, &systemd, id),
            Err(PidRefusal::OwnNamespace)
        );
        // Same inode on another device is another namespace file.
        assert_eq!(pid_namespace_ok(own, (5, own.1), &systemd, id), Ok(()));
        for other in [
            "0::/system.slice/sshd.service\n",
            "0::/kubepods.slice/kubepods-pod2.slice/cri-containerd-aaaa.scope\n",
            "",
            "garbage",
        ] {
            assert_eq!(
                pid_namespace_ok(own, pod, other, id),
                Err(PidRefusal::NotTheSandbox),
                "{other:?}"
            );
        }
        // The id must be in the path, not in the controllers' names.
        assert_eq!(
            pid_namespace_ok(own, pod, &format!("3:{id}:/\n"), id),
            Err(PidRefusal::NotTheSandbox)
        );
        assert_eq!(
            pid_namespace_ok(own, pod, &systemd, ""),
            Err(PidRefusal::NoSandboxId)
        );
    }

    /// crisp's own pid as the sandbox's: its namespace is the node's (crisp's), refused.
    #[test]
    fn a_pid_in_crisps_own_namespace_is_refused() {
        let info = format!(r#"{{"pid":{}}}"#, std::process::id());
        let why = resolve(Some(&info), "any-sandbox").unwrap_err();
        assert!(why.contains("crisp's own network namespace"), "{why}");
        // Named by the runtime as the sandbox's namespace path, the same file is used as given.
        let spec = format!(
            r#"{{"runtimeSpec":{{"linux":{{"namespaces":[{{"type":"network","path":"/proc/{}/ns/net"}}]}}}}}}"#,
            std::process::id()
        );
        assert!(resolve(Some(&spec), "any-sandbox").is_ok());
    }

    #[test]
    fn only_network_namespaces_open() {
        let own = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(own.inode() > 0);
        assert!(!own.moved());
        assert!(NetNs::open(Path::new("/proc/self/ns/uts"))
            .unwrap_err()
            .to_string()
            .contains("not a network namespace"));
        assert!(NetNs::open(Path::new("/proc/self/status"))
            .unwrap_err()
            .to_string()
            .contains("not a namespace file"));
    }

    /// crisp's own namespace holds its addresses and no other, and knows itself.
    #[tokio::test]
    async fn a_namespace_holds_its_own_addresses() {
        let ns = NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
        assert!(ns.is_crisps_own().unwrap());
        assert!(ns.holds("127.0.0.1".parse().unwrap()).await.unwrap());
        assert!(!ns.holds("203.0.113.77".parse().unwrap()).await.unwrap());
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
