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
//!
//! The `sd-notify` crate sends the notifications to a socket path and reads `LISTEN_PID` and
//! `LISTEN_FDS` (the process check, and marking the fds close-on-exec). What is still done here,
//! because sd-notify 0.5 does not do it the way systemd's own library does:
//!
//! - `NOTIFY_SOCKET=@name`, a Linux abstract socket: sd-notify connects to the value as a path
//!   and fails (ENOENT), where sd_notify(3) sends to the abstract name. An empty value is no
//!   service manager here (sd-notify fails with EINVAL).
//! - `LISTEN_FDNAMES`: sd-notify's `listen_fds_with_names` fails ("invalid LISTEN_FDNAMES") when
//!   the variables were meant for another process (`LISTEN_PID` differs) or announce no fd, yet
//!   `LISTEN_FDNAMES` is set, which is how a socket-activated parent leaks all three; there
//!   sd_listen_fds_with_names(3) returns no fd, and crisp must start and bind its own socket
//!   (tests/it/systemd_activation.rs, `listen_fds_meant_for_another_process_are_ignored`).
//!   Names are paired here, and only with the fds sd-notify's `listen_fds` returned.
//! - Which inherited fd is crisp's (the only one, or the one named [`FD_NAME`]), the check that
//!   it is a listening unix stream socket, and its path: nothing generic does that.
//!
//! Taken from sd-notify as it is: `LISTEN_PID=0` counts as another process's (ignored, as a
//! mismatch); values with spaces are malformed; an announced fd that is not open is an error
//! (EBADF), as in sd_listen_fds(3), which also bounds an absurd `LISTEN_FDS`. Its errors do not
//! say which value was wrong, so [`ListenFdsError::Env`] shows both.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use sd_notify::NotifyState;

/// The name crisp looks for when systemd passes more than one socket (`FileDescriptorName=`).
pub const FD_NAME: &str = "crisp";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenFdsError {
    /// From sd-notify: a malformed `LISTEN_PID` or `LISTEN_FDS`, or an announced fd not open.
    #[error("socket activation: LISTEN_PID={pid:?} LISTEN_FDS={count:?}: {reason}")]
    Env {
        pid: String,
        count: String,
        reason: String,
    },
    #[error(
        "socket activation: LISTEN_FDNAMES={names:?} names {got} sockets but LISTEN_FDS={expected}"
    )]
    NamesMismatch {
        names: String,
        got: usize,
        expected: usize,
    },
    #[error(
        "socket activation: systemd passed {0} sockets and none is named `{FD_NAME}`; \
         give crisp's socket unit one ListenStream= (or FileDescriptorName={FD_NAME})"
    )]
    Ambiguous(usize),
    #[error("socket activation: inherited fd {fd} ({name}) {reason}")]
    NotAListener {
        fd: RawFd,
        name: String,
        reason: String,
    },
}

/// One fd announced by the environment, with its name (not yet checked). The number only:
/// [`take_listener`] keeps the owned descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenFd {
    pub(crate) fd: RawFd,
    /// From `LISTEN_FDNAMES` (systemd's `FileDescriptorName=`, default the socket unit's name).
    pub(crate) name: Option<String>,
}

/// Pairs the fds sd-notify's `listen_fds` returned with `LISTEN_FDNAMES`, as
/// sd_listen_fds_with_names(3) does: no fd, no names to check (the variables leaked from a
/// parent, see the module doc). Unset or empty names mean unnamed fds.
pub fn name_fds(
    fds: Vec<RawFd>,
    listen_fdnames: Option<&str>,
) -> Result<Vec<ListenFd>, ListenFdsError> {
    let names: Vec<Option<String>> = match listen_fdnames {
        _ if fds.is_empty() => return Ok(Vec::new()),
        None | Some("") => vec![None; fds.len()],
        Some(s) => {
            let v: Vec<Option<String>> = s.split(':').map(|x| Some(x.to_string())).collect();
            if v.len() != fds.len() {
                return Err(ListenFdsError::NamesMismatch {
                    names: s.to_string(),
                    got: v.len(),
                    expected: fds.len(),
                });
            }
            v
        }
    };
    Ok(fds
        .into_iter()
        .zip(names)
        .map(|(fd, name)| ListenFd { fd, name })
        .collect())
}

/// Which of the inherited fds crisp serves on (its index in `fds`): the only one, or the one
/// named [`FD_NAME`].
fn select_index(fds: &[ListenFd]) -> Result<Option<usize>, ListenFdsError> {
    match fds {
        [] => Ok(None),
        [_] => Ok(Some(0)),
        many => many
            .iter()
            .position(|f| f.name.as_deref() == Some(FD_NAME))
            .map(Some)
            .ok_or(ListenFdsError::Ambiguous(many.len())),
    }
}

/// A listening unix stream socket handed over by systemd.
#[derive(Debug)]
pub struct Inherited {
    pub(crate) fd: OwnedFd,
    pub(crate) name: Option<String>,
    /// The address it is bound to (None for an unnamed or abstract socket).
    pub(crate) path: Option<PathBuf>,
}

/// Takes the listening socket systemd passed (if any), once per process: checks that it is a
/// listening unix stream socket, has every inherited fd marked close-on-exec, and removes
/// `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` from the environment so that nothing crisp
/// spawns believes the sockets are meant for it. The inherited fds crisp does not serve on are
/// closed (systemd keeps its own).
pub fn take_listener() -> Result<Option<Inherited>, ListenFdsError> {
    let var = |k: &str| std::env::var(k).ok();
    let (pid, count, names) = (var("LISTEN_PID"), var("LISTEN_FDS"), var("LISTEN_FDNAMES"));
    // Checks LISTEN_PID against this process and marks every announced fd close-on-exec; None
    // when they were taken before.
    let Some(fds) = crate::sys::inherit::take_listen_fds() else {
        return Ok(None);
    };
    for k in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(k);
    }
    let mut owned = fds.map_err(|e| ListenFdsError::Env {
        pid: pid.unwrap_or_default(),
        count: count.unwrap_or_default(),
        reason: e.to_string(),
    })?;
    let numbers = owned.iter().map(AsRawFd::as_raw_fd).collect();
    let fds = name_fds(numbers, names.as_deref())?;
    let Some(i) = select_index(&fds)? else {
        return Ok(None);
    };
    let ListenFd { fd: number, name } = fds[i].clone();
    let fd = owned.swap_remove(i);
    check_listening_unix_stream(&fd).map_err(|reason| ListenFdsError::NotAListener {
        fd: number,
        name: name.clone().unwrap_or_else(|| "unnamed".into()),
        reason,
    })?;
    let path = crate::sys::socket::local_path(&fd);
    Ok(Some(Inherited { fd, name, path }))
}

/// `Err(reason)` unless `fd` is a listening, AF_UNIX, SOCK_STREAM socket.
pub fn check_listening_unix_stream(fd: impl AsFd) -> Result<(), String> {
    use crate::sys::socket as os;
    let fd = fd.as_fd();
    if !os::is_socket(fd).map_err(|e| format!("cannot be examined (fstat): {e}"))? {
        return Err("is not a socket (the socket unit must use ListenStream=)".into());
    }
    let domain = os::domain(fd).map_err(|e| format!("SO_DOMAIN: {e}"))?;
    if domain != libc::AF_UNIX {
        return Err(format!(
            "is not a unix socket (domain {domain}); ListenStream= must be a path"
        ));
    }
    let ty = os::socket_type(fd).map_err(|e| format!("SO_TYPE: {e}"))?;
    if ty != libc::SOCK_STREAM {
        return Err(format!("is not a stream socket (type {ty}); use ListenStream=, not ListenDatagram=/ListenSequentialPacket="));
    }
    if !os::is_listening(fd).map_err(|e| format!("SO_ACCEPTCONN: {e}"))? {
        return Err(
            "is not listening (Accept=yes is not supported: crisp serves all connections itself)"
                .into(),
        );
    }
    Ok(())
}

/// Sends `states` to the service manager. `Ok(false)` when not running under a manager that
/// asked for notifications (`NOTIFY_SOCKET` unset or empty).
pub fn notify(states: &[NotifyState]) -> io::Result<bool> {
    let Some(v) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) else {
        return Ok(false);
    };
    let ctx = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("NOTIFY_SOCKET={}: {e}", v.to_string_lossy()),
        )
    };
    match std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).strip_prefix(b"@") {
        // The abstract namespace, which sd-notify does not handle (see the module doc).
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).map_err(ctx)?;
            std::os::unix::net::UnixDatagram::unbound()
                .and_then(|sock| sock.send_to_addr(msg.as_bytes(), &addr))
                .map_err(ctx)?;
        }
        None => sd_notify::notify(states).map_err(ctx)?,
    }
    Ok(true)
}

/// `STATUS=` text: one line, no control characters.
fn status_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Tells systemd crisp is serving (Type=notify: systemd starts kubelet only after this).
/// Call it only once the socket is listening. Failures are logged, never fatal.
pub fn notify_ready(status: &str) {
    send_logged(&[
        NotifyState::Ready,
        NotifyState::Status(&status_line(status)),
    ]);
}

/// Tells systemd crisp is shutting down (draining in-flight calls).
pub fn notify_stopping(status: &str) {
    send_logged(&[
        NotifyState::Stopping,
        NotifyState::Status(&status_line(status)),
    ]);
}

/// systemd's watchdog interval for crisp (`WatchdogSec=` in the unit: `WATCHDOG_USEC`, and
/// `WATCHDOG_PID` naming this process when set); None when systemd does not watch crisp.
pub fn watchdog_interval() -> Option<std::time::Duration> {
    sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
}

/// `WATCHDOG=1`: crisp is making progress ([`crate::watchdog`] sends it only then). Failures
/// are logged at debug (a missed one is harmless; many make systemd restart crisp, as meant).
pub fn notify_watchdog() {
    if let Err(e) = notify(&[NotifyState::Watchdog]) {
        tracing::debug!(error = %e, "cannot send WATCHDOG=1 to the service manager");
    }
}

fn send_logged(states: &[NotifyState]) {
    match notify(states) {
        Ok(true) => tracing::debug!(message = ?states, "sent to the service manager"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "cannot notify the service manager"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fd_with_or_without_a_name() {
        assert_eq!(
            name_fds(vec![3], None),
            Ok(vec![ListenFd { fd: 3, name: None }])
        );
        assert_eq!(
            name_fds(vec![3], Some("")),
            Ok(vec![ListenFd { fd: 3, name: None }]),
            "empty names mean unnamed"
        );
        assert_eq!(
            name_fds(vec![3], Some("crisp.socket")),
            Ok(vec![ListenFd {
                fd: 3,
                name: Some("crisp.socket".into())
            }])
        );
    }

    #[test]
    fn names_of_no_fds_are_ignored() {
        // LISTEN_PID named another process (sd-notify returned no fd): the leaked LISTEN_FDNAMES
        // is not checked against a count of 0.
        assert_eq!(name_fds(vec![], Some("crisp")), Ok(vec![]));
        assert_eq!(name_fds(vec![], Some("a:b")), Ok(vec![]));
        assert_eq!(name_fds(vec![], None), Ok(vec![]));
    }

    #[test]
    fn several_fds_with_names() {
        let v = name_fds(vec![3, 4, 5], Some("a:crisp:c")).unwrap();
        assert_eq!(v.iter().map(|f| f.fd).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(v[select_index(&v).unwrap().unwrap()].fd, 4);
        let v = name_fds(vec![3, 4], None).unwrap();
        assert_eq!(select_index(&v), Err(ListenFdsError::Ambiguous(2)));
        assert_eq!(select_index(&[]), Ok(None));
    }

    #[test]
    fn names_that_do_not_match_the_count_are_an_error() {
        assert_eq!(
            name_fds(vec![3, 4], Some("only-one")),
            Err(ListenFdsError::NamesMismatch {
                names: "only-one".into(),
                got: 1,
                expected: 2
            })
        );
        assert_eq!(
            name_fds(vec![3], Some("a:b")),
            Err(ListenFdsError::NamesMismatch {
                names: "a:b".into(),
                got: 2,
                expected: 1
            })
        );
    }

    #[test]
    fn checks_the_inherited_socket_kind() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("l.sock")).unwrap();
        assert_eq!(check_listening_unix_stream(&l), Ok(()));
        assert_eq!(
            crate::sys::socket::local_path(&l),
            Some(dir.path().join("l.sock"))
        );
        let d = std::os::unix::net::UnixDatagram::unbound().unwrap();
        assert!(check_listening_unix_stream(&d)
            .unwrap_err()
            .contains("not a stream socket"));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(check_listening_unix_stream(&a)
            .unwrap_err()
            .contains("not listening"));
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(check_listening_unix_stream(&f)
            .unwrap_err()
            .contains("not a socket"));
        let t = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(check_listening_unix_stream(&t)
            .unwrap_err()
            .contains("not a unix socket"));
    }
}
