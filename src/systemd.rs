//! systemd integration without libsystemd: readiness notification (sd_notify(3) over
//! `$NOTIFY_SOCKET`) and socket activation (sd_listen_fds(3): `$LISTEN_FDS`, `$LISTEN_PID`,
//! `$LISTEN_FDNAMES`).
//!
//! With `systemd/crisp.socket`, systemd owns `/run/crisp/crisp.sock`: the listening socket
//! survives crisp restarts and upgrades, and connections made while crisp is down wait in the
//! listen backlog instead of being refused. crisp then serves on the inherited fd 3 and must not
//! remove the socket file when it exits.
//!
//! Every function here is a no-op outside systemd (no variable set), so the same binary runs
//! by hand, under systemd with or without the socket unit, and in tests.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// First inherited fd (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// The name crisp looks for when systemd passes more than one socket (`FileDescriptorName=`).
pub const FD_NAME: &str = "crisp";

/// Refuse absurd counts rather than walk thousands of fds.
const MAX_LISTEN_FDS: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenFdsError {
    #[error("socket activation: LISTEN_PID={0:?} is not a process id")]
    BadPid(String),
    #[error("socket activation: LISTEN_FDS={0:?} is not a count of file descriptors (expected 1..={MAX_LISTEN_FDS})")]
    BadCount(String),
    #[error("socket activation: LISTEN_FDNAMES={names:?} names {got} sockets but LISTEN_FDS={expected}")]
    NamesMismatch { names: String, got: usize, expected: usize },
    #[error(
        "socket activation: systemd passed {0} sockets and none is named `{FD_NAME}`; \
         give crisp's socket unit one ListenStream= (or FileDescriptorName={FD_NAME})"
    )]
    Ambiguous(usize),
    #[error("socket activation: inherited fd {fd} ({name}) {reason}")]
    NotAListener { fd: RawFd, name: String, reason: String },
}

/// One fd announced by the environment (not yet checked or owned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenFd {
    pub fd: RawFd,
    /// From `LISTEN_FDNAMES` (systemd's `FileDescriptorName=`, default the socket unit's name).
    pub name: Option<String>,
}

/// Parses the socket-activation variables the way sd_listen_fds(3) does: nothing is inherited
/// when `LISTEN_PID` is unset or names another process (the variables leaked from a parent),
/// or when `LISTEN_FDS` is unset or 0. Malformed values are errors, not silently ignored.
pub fn parse_listen_env(listen_pid: Option<&str>, listen_fds: Option<&str>, listen_fdnames: Option<&str>, my_pid: u32) -> Result<Vec<ListenFd>, ListenFdsError> {
    let Some(pid) = listen_pid else { return Ok(Vec::new()) };
    let pid: u32 = pid.trim().parse().ok().filter(|p| *p > 0).ok_or_else(|| ListenFdsError::BadPid(pid.to_string()))?;
    if pid != my_pid {
        return Ok(Vec::new());
    }
    let Some(count) = listen_fds else { return Ok(Vec::new()) };
    let n: usize = count.trim().parse().map_err(|_| ListenFdsError::BadCount(count.to_string()))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if n > MAX_LISTEN_FDS {
        return Err(ListenFdsError::BadCount(count.to_string()));
    }
    let names: Vec<Option<String>> = match listen_fdnames {
        None | Some("") => vec![None; n],
        Some(s) => {
            let v: Vec<Option<String>> = s.split(':').map(|x| Some(x.to_string())).collect();
            if v.len() != n {
                return Err(ListenFdsError::NamesMismatch { names: s.to_string(), got: v.len(), expected: n });
            }
            v
        }
    };
    Ok(names.into_iter().enumerate().map(|(i, name)| ListenFd { fd: LISTEN_FDS_START + i as RawFd, name }).collect())
}

/// Which of the inherited fds crisp serves on: the only one, or the one named [`FD_NAME`].
pub fn select(fds: &[ListenFd]) -> Result<Option<&ListenFd>, ListenFdsError> {
    match fds {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => many.iter().find(|f| f.name.as_deref() == Some(FD_NAME)).map(Some).ok_or(ListenFdsError::Ambiguous(many.len())),
    }
}

/// A listening unix stream socket handed over by systemd.
#[derive(Debug)]
pub struct Inherited {
    pub fd: OwnedFd,
    pub name: Option<String>,
    /// The address it is bound to (None for an unnamed or abstract socket).
    pub path: Option<PathBuf>,
}

static TAKEN: AtomicBool = AtomicBool::new(false);

/// Takes the listening socket systemd passed (if any), once per process: checks that it is a
/// listening unix stream socket, marks every inherited fd close-on-exec, and removes
/// `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from the environment so that nothing crisp
/// spawns believes the sockets are meant for it.
pub fn take_listener() -> Result<Option<Inherited>, ListenFdsError> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    let var = |k: &str| std::env::var(k).ok();
    let (pid, fds, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    let fds = parse_listen_env(pid.as_deref(), fds.as_deref(), names.as_deref(), std::process::id())?;
    for f in &fds {
        // SAFETY: fcntl on an fd number systemd says it passed; a bad fd just fails.
        unsafe {
            let flags = libc::fcntl(f.fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(f.fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    let Some(chosen) = select(&fds)? else { return Ok(None) };
    let name = chosen.name.clone().unwrap_or_else(|| "unnamed".into());
    check_listening_unix_stream(chosen.fd).map_err(|reason| ListenFdsError::NotAListener { fd: chosen.fd, name, reason })?;
    // SAFETY: the fd was passed to this process (LISTEN_PID matched), is open (checked above),
    // and nothing else in crisp owns it; TAKEN guarantees it is wrapped at most once.
    let fd = unsafe { OwnedFd::from_raw_fd(chosen.fd) };
    let path = socket_path(fd.as_raw_fd());
    Ok(Some(Inherited { fd, name: chosen.name.clone(), path }))
}

fn getsockopt_int(fd: RawFd, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, opt, &mut v as *mut _ as *mut libc::c_void, &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// `Err(reason)` unless `fd` is an open, listening, AF_UNIX, SOCK_STREAM socket.
pub fn check_listening_unix_stream(fd: RawFd) -> Result<(), String> {
    // SAFETY: fstat into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!("is not open: {}", io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err("is not a socket (the socket unit must use ListenStream=)".into());
    }
    let domain = getsockopt_int(fd, libc::SO_DOMAIN).map_err(|e| format!("SO_DOMAIN: {e}"))?;
    if domain != libc::AF_UNIX {
        return Err(format!("is not a unix socket (domain {domain}); ListenStream= must be a path"));
    }
    let ty = getsockopt_int(fd, libc::SO_TYPE).map_err(|e| format!("SO_TYPE: {e}"))?;
    if ty != libc::SOCK_STREAM {
        return Err(format!("is not a stream socket (type {ty}); use ListenStream=, not ListenDatagram=/ListenSequentialPacket="));
    }
    let acc = getsockopt_int(fd, libc::SO_ACCEPTCONN).map_err(|e| format!("SO_ACCEPTCONN: {e}"))?;
    if acc == 0 {
        return Err("is not listening (Accept=yes is not supported: crisp serves all connections itself)".into());
    }
    Ok(())
}

fn socket_path(fd: RawFd) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: getsockname into a zeroed sockaddr_un with its size.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    if unsafe { libc::getsockname(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return None;
    }
    let off = std::mem::size_of::<libc::sa_family_t>();
    let n = (len as usize).saturating_sub(off).min(addr.sun_path.len());
    let bytes: Vec<u8> = addr.sun_path[..n].iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
    if bytes.is_empty() {
        return None; // unnamed or abstract
    }
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(&bytes)))
}

/// Where `NOTIFY_SOCKET` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyAddr {
    Path(PathBuf),
    /// Linux abstract namespace (`@name` in the variable), without the leading NUL.
    Abstract(Vec<u8>),
}

pub fn parse_notify_socket(v: &str) -> io::Result<NotifyAddr> {
    if let Some(name) = v.strip_prefix('@') {
        if name.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET=@ names no abstract socket"));
        }
        return Ok(NotifyAddr::Abstract(name.as_bytes().to_vec()));
    }
    if v.starts_with('/') {
        return Ok(NotifyAddr::Path(PathBuf::from(v)));
    }
    Err(io::Error::new(io::ErrorKind::Unsupported, format!("NOTIFY_SOCKET={v:?}: only absolute paths and @abstract names are supported")))
}

/// Sends `state` (newline-separated `KEY=VALUE` assignments) to the service manager.
/// `Ok(false)` when not running under a manager that asked for notifications.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(v) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(false) };
    let v = v.to_str().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET is not UTF-8"))?.to_string();
    if v.is_empty() {
        return Ok(false);
    }
    let addr = parse_notify_socket(&v)?;
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    let ctx = |e: io::Error| io::Error::new(e.kind(), format!("NOTIFY_SOCKET={v}: {e}"));
    match addr {
        NotifyAddr::Path(p) => sock.send_to(state.as_bytes(), p).map_err(ctx)?,
        NotifyAddr::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            let a = std::os::unix::net::SocketAddr::from_abstract_name(&name).map_err(ctx)?;
            sock.send_to_addr(state.as_bytes(), &a).map_err(ctx)?
        }
    };
    Ok(true)
}

/// `STATUS=` text: one line, no control characters.
fn status_line(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// Tells systemd crisp is serving (Type=notify: systemd starts kubelet only after this).
/// Call it only once the socket is listening. Failures are logged, never fatal.
pub fn notify_ready(status: &str) {
    send_logged(&format!("READY=1\nSTATUS={}", status_line(status)));
}

/// Tells systemd crisp is shutting down (draining in-flight calls).
pub fn notify_stopping(status: &str) {
    send_logged(&format!("STOPPING=1\nSTATUS={}", status_line(status)));
}

fn send_logged(msg: &str) {
    match notify(msg) {
        Ok(true) => tracing::debug!(message = msg, "sent to the service manager"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "cannot notify the service manager"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u32 = 4242;

    fn parse(pid: Option<&str>, fds: Option<&str>, names: Option<&str>) -> Result<Vec<ListenFd>, ListenFdsError> {
        parse_listen_env(pid, fds, names, ME)
    }

    #[test]
    fn nothing_inherited_without_variables() {
        assert_eq!(parse(None, None, None), Ok(vec![]));
        assert_eq!(parse(None, Some("1"), None), Ok(vec![]), "LISTEN_FDS without LISTEN_PID is ignored");
        assert_eq!(parse(Some("4242"), None, None), Ok(vec![]));
        assert_eq!(parse(Some("4242"), Some("0"), None), Ok(vec![]));
    }

    #[test]
    fn variables_for_another_process_are_ignored() {
        assert_eq!(parse(Some("1"), Some("1"), None), Ok(vec![]));
        assert_eq!(parse(Some("4243"), Some("2"), Some("a:b")), Ok(vec![]));
    }

    #[test]
    fn one_fd_starts_at_3() {
        assert_eq!(parse(Some("4242"), Some("1"), None), Ok(vec![ListenFd { fd: 3, name: None }]));
        assert_eq!(parse(Some(" 4242 "), Some("1"), Some("crisp.socket")), Ok(vec![ListenFd { fd: 3, name: Some("crisp.socket".into()) }]));
    }

    #[test]
    fn several_fds_with_names() {
        let v = parse(Some("4242"), Some("3"), Some("a:crisp:c")).unwrap();
        assert_eq!(v.iter().map(|f| f.fd).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(select(&v).unwrap().unwrap().fd, 4);
        let v = parse(Some("4242"), Some("2"), None).unwrap();
        assert_eq!(select(&v), Err(ListenFdsError::Ambiguous(2)));
        assert_eq!(select(&[]), Ok(None));
    }

    #[test]
    fn malformed_values_are_errors() {
        assert_eq!(parse(Some("abc"), Some("1"), None), Err(ListenFdsError::BadPid("abc".into())));
        assert_eq!(parse(Some("0"), Some("1"), None), Err(ListenFdsError::BadPid("0".into())));
        assert_eq!(parse(Some("-5"), Some("1"), None), Err(ListenFdsError::BadPid("-5".into())));
        assert_eq!(parse(Some("4242"), Some("x"), None), Err(ListenFdsError::BadCount("x".into())));
        assert_eq!(parse(Some("4242"), Some("-1"), None), Err(ListenFdsError::BadCount("-1".into())));
        assert_eq!(parse(Some("4242"), Some("100000"), None), Err(ListenFdsError::BadCount("100000".into())));
        assert_eq!(parse(Some("4242"), Some("2"), Some("only-one")), Err(ListenFdsError::NamesMismatch { names: "only-one".into(), got: 1, expected: 2 }));
    }

    #[test]
    fn empty_names_mean_unnamed() {
        assert_eq!(parse(Some("4242"), Some("1"), Some("")), Ok(vec![ListenFd { fd: 3, name: None }]));
    }

    #[test]
    fn notify_socket_forms() {
        assert_eq!(parse_notify_socket("/run/systemd/notify").unwrap(), NotifyAddr::Path("/run/systemd/notify".into()));
        assert_eq!(parse_notify_socket("@sd-notify-1").unwrap(), NotifyAddr::Abstract(b"sd-notify-1".to_vec()));
        assert!(parse_notify_socket("@").is_err());
        assert!(parse_notify_socket("relative/path").is_err());
        assert!(parse_notify_socket("vsock:2:1234").is_err());
    }

    #[test]
    fn checks_the_inherited_socket_kind() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("l.sock")).unwrap();
        assert_eq!(check_listening_unix_stream(l.as_raw_fd()), Ok(()));
        assert_eq!(socket_path(l.as_raw_fd()), Some(dir.path().join("l.sock")));
        let d = std::os::unix::net::UnixDatagram::unbound().unwrap();
        assert!(check_listening_unix_stream(d.as_raw_fd()).unwrap_err().contains("not a stream socket"));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(check_listening_unix_stream(a.as_raw_fd()).unwrap_err().contains("not listening"));
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(check_listening_unix_stream(f.as_raw_fd()).unwrap_err().contains("not a socket"));
        let t = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(check_listening_unix_stream(t.as_raw_fd()).unwrap_err().contains("not a unix socket"));
    }
}
