//! Sockets: the relay's `recv`, `send` and `poll`, the eventfd that wakes a relay thread, the
//! kubelet-facing listening socket, and what socket activation checks of an inherited one.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use rustix::event::EventfdFlags;
use rustix::fs::{FileType, Mode};
use rustix::io::Errno;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

/// One `recv(2)` into `buf`'s spare capacity, the bytes read then counted in `buf`: how many
/// (0 at end of stream, and when `buf` has no spare capacity). EINTR is retried; nothing to
/// read is `WouldBlock`.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut BytesMut) -> io::Result<usize> {
    // SAFETY: `as_uninit_slice_mut` asks that no uninitialised byte be written into the slice;
    // it is only passed to recv(2), which writes bytes it received (initialised ones) and
    // nothing else.
    let spare: &mut [MaybeUninit<u8>] = unsafe { buf.chunk_mut().as_uninit_slice_mut() };
    let n = loop {
        match rustix::net::recv(fd, &mut *spare, RecvFlags::empty()) {
            Ok(((filled, _), _)) => break filled.len(),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    // SAFETY: recv(2) initialised the first `n` bytes of the spare capacity (rustix returned
    // them as `filled`), so `n` is at most the spare capacity and those bytes may be counted.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}

/// One `send(2)` with `MSG_NOSIGNAL`: how many bytes the socket took (0 when it has no room).
/// A peer that has gone is an error (EPIPE), never a SIGPIPE, whatever the process does with
/// that signal. EINTR is retried.
pub(crate) fn send(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<usize> {
    loop {
        match rustix::net::send(fd, bytes, SendFlags::NOSIGNAL) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(Errno::WOULDBLOCK) => return Ok(0),
            Err(e) => return Err(e.into()),
        }
    }
}

/// A new non-blocking, close-on-exec eventfd with its counter at 0.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC,
    )?)
}

/// Adds one to an eventfd's counter (makes it readable). A full counter (EAGAIN) is already
/// readable, so failures are of no consequence.
pub(crate) fn eventfd_add_one(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Resets an eventfd's counter to 0 (not readable). Already 0 (EAGAIN) is what was wanted.
pub(crate) fn eventfd_reset(fd: BorrowedFd<'_>) {
    let mut counter = [0u8; 8];
    let _ = rustix::io::read(fd, &mut counter);
}

/// A `poll(2)` entry for `fd`, asking for readable and/or writable; an entry that asks for
/// nothing (or has no descriptor) is skipped by poll(2). The entry holds the descriptor's number
/// only for the length of one `poll` call, while the borrow it was made from is alive.
pub(crate) fn poll_entry(fd: Option<BorrowedFd<'_>>, read: bool, write: bool) -> libc::pollfd {
    let events = if read { libc::POLLIN } else { 0 } | if write { libc::POLLOUT } else { 0 };
    libc::pollfd {
        fd: match fd {
            Some(fd) if events != 0 => fd.as_raw_fd(),
            _ => -1,
        },
        events,
        revents: 0,
    }
}

/// `timeout` in whole milliseconds for `poll(2)`, its microseconds rounded up (without the u128
/// arithmetic of `Duration::as_micros`: this runs on every wakeup of a relay thread).
fn poll_ms(timeout: Duration) -> libc::c_int {
    let ms = timeout
        .as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(timeout.subsec_micros().div_ceil(1000)));
    ms.min(i32::MAX as u64) as libc::c_int
}

/// `poll(2)` on `fds`, for at most `timeout` (rounded up to whole milliseconds); EINTR counts as
/// a return with nothing ready. An entry with a negative descriptor is skipped, as poll(2) says.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<()> {
    let ms = poll_ms(timeout);
    // SAFETY: `fds` is an exclusively borrowed array of `fds.len()` initialised pollfd structs,
    // and poll(2) writes nothing but their `revents` fields. The descriptors in them are numbers
    // the kernel looks up, never pointers: one that is closed is reported as POLLNVAL, so no
    // ownership of any descriptor is assumed.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        for p in fds.iter_mut() {
            p.revents = 0;
        }
    }
    Ok(())
}

/// Serialises the umask change in [`bind_listen_unix`] (the umask is process-wide).
static UMASK: parking_lot::Mutex<()> = parking_lot::const_mutex(());

/// A listening unix stream socket bound at `path`, whose file has mode `mode` from the moment it
/// exists: socket → umask → bind → chmod → listen. The umask masks everything but `mode` while
/// bind creates the file, so no looser mode ever exists: ordering chmod before listen alone is
/// not enough, because the kernel checks a connecting client's write permission on the file
/// before it looks at whether the socket listens — a client that passed the check while the file
/// still had the umask's mode could complete its connect right after `listen` (seen once in
/// thousands of non-root connects racing a start on a loaded machine). chmod then sets the exact
/// mode whatever the umask was. The file is removed again if chmod, chown or listen fails.
///
/// With `gid`, the file is also given to that group before `listen` (`admin.group`), so the
/// group's members can connect from the first connection on.
pub fn bind_listen_unix(path: &Path, mode: u32, gid: Option<u32>) -> io::Result<OwnedFd> {
    let addr = SocketAddrUnix::new(path).map_err(|e| match e {
        Errno::NAMETOOLONG => io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"),
        e => e.into(),
    })?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let bound = {
        let _one = UMASK.lock();
        let old = rustix::process::umask(Mode::from_raw_mode(!mode & 0o777));
        let bound = rustix::net::bind(&fd, &addr);
        rustix::process::umask(old);
        bound
    };
    bound?;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    if let Some(gid) = gid {
        if let Err(e) = std::os::unix::fs::chown(path, None, Some(gid)) {
            let _ = std::fs::remove_file(path);
            return Err(io::Error::new(
                e.kind(),
                format!("giving {} to group {gid}: {e}", path.display()),
            ));
        }
    }
    if let Err(e) = rustix::net::listen(&fd, 1024) {
        let _ = std::fs::remove_file(path);
        return Err(e.into());
    }
    Ok(fd)
}

/// Whether `fd` is a socket (fstat(2)'s file type).
pub fn is_socket(fd: impl AsFd) -> io::Result<bool> {
    let st = rustix::fs::fstat(fd)?;
    Ok(FileType::from_raw_mode(st.st_mode) == FileType::Socket)
}

/// The socket's address family (`SO_DOMAIN`), e.g. `libc::AF_UNIX`.
pub fn domain(fd: impl AsFd) -> io::Result<i32> {
    Ok(i32::from(rustix::net::sockopt::socket_domain(fd)?.as_raw()))
}

/// The socket's type (`SO_TYPE`), e.g. `libc::SOCK_STREAM`.
pub fn socket_type(fd: impl AsFd) -> io::Result<i32> {
    let raw = rustix::net::sockopt::socket_type(fd)?.as_raw();
    i32::try_from(raw).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Whether the socket listens (`SO_ACCEPTCONN`).
pub fn is_listening(fd: impl AsFd) -> io::Result<bool> {
    Ok(rustix::net::sockopt::socket_acceptconn(fd)?)
}

/// The path a unix socket is bound to; None for an unnamed or abstract socket, or any other
/// kind of socket.
pub fn local_path(fd: impl AsFd) -> Option<PathBuf> {
    let addr = rustix::net::getsockname(fd).ok()?;
    let unix = SocketAddrUnix::try_from(addr).ok()?;
    let bytes = unix.path_bytes()?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn a_poll_timeout_is_its_microseconds_rounded_up_to_milliseconds() {
        let reference =
            |d: Duration| d.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        for d in [
            Duration::ZERO,
            Duration::from_nanos(999),
            Duration::from_micros(1),
            Duration::from_micros(999),
            Duration::from_micros(1000),
            Duration::from_micros(1001),
            Duration::from_millis(10),
            Duration::new(3, 999_999_999),
            Duration::from_secs(i32::MAX as u64 / 1000 + 1),
            Duration::MAX,
        ] {
            assert_eq!(poll_ms(d), reference(d), "{d:?}");
        }
    }

    #[test]
    fn a_listening_socket_is_made_with_its_mode_and_examined() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sock");
        let fd = bind_listen_unix(&path, 0o640, None).unwrap();
        let md = std::fs::symlink_metadata(&path).unwrap();
        assert!(md.file_type().is_socket());
        assert_eq!(md.permissions().mode() & 0o7777, 0o640);
        assert_eq!(
            (is_socket(&fd).unwrap(), domain(&fd).unwrap()),
            (true, libc::AF_UNIX)
        );
        assert_eq!(socket_type(&fd).unwrap(), libc::SOCK_STREAM);
        assert!(is_listening(&fd).unwrap());
        assert_eq!(local_path(&fd), Some(path.clone()));
        // A second bind on the same path fails and leaves the first one's file alone.
        assert!(bind_listen_unix(&path, 0o600, None).is_err());
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
    }

    #[test]
    fn a_path_longer_than_sun_path_is_refused() {
        let long = Path::new("/tmp").join("x".repeat(200));
        let e = bind_listen_unix(&long, 0o600, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("socket path too long"), "{e}");
    }

    #[test]
    fn unnamed_sockets_have_no_path() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(local_path(&a), None);
        assert!(!is_listening(&a).unwrap());
    }

    #[test]
    fn an_eventfd_is_readable_until_reset() {
        let fd = eventfd().unwrap();
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
            events: libc::POLLIN,
            revents: 0,
        }];
        poll(&mut fds, Duration::ZERO).unwrap();
        assert_eq!(fds[0].revents, 0);
        eventfd_add_one(fd.as_fd());
        eventfd_add_one(fd.as_fd());
        poll(&mut fds, Duration::ZERO).unwrap();
        assert_eq!(fds[0].revents, libc::POLLIN);
        eventfd_reset(fd.as_fd());
        poll(&mut fds, Duration::ZERO).unwrap();
        assert_eq!(fds[0].revents, 0);
    }
}
