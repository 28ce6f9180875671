//! The relay thread's sockets: non-blocking unix streams, written straight away and queued only
//! when the peer's receive buffer is full, an eventfd that wakes the thread, and `poll(2)`.
//!
//! A relayed hop is one `poll` return, one `recv` and one `send` — what a byte splice does, without
//! an async runtime's scheduler, reactor and timer wheel around it (see [`super::relay`]).

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use bytes::BytesMut;

use crate::sys::socket as os;

/// One end of a relayed connection.
pub struct Sock {
    s: UnixStream,
    /// Bytes accepted by [`Self::write`] that the peer had no room for yet, from `sent` on.
    queued: Vec<u8>,
    sent: usize,
}

impl Sock {
    /// Takes a connected stream and makes it non-blocking.
    pub fn new(s: UnixStream) -> io::Result<Self> {
        s.set_nonblocking(true)?;
        Ok(Sock {
            s,
            queued: Vec::new(),
            sent: 0,
        })
    }

    /// Reads what the socket has into `buf`'s spare capacity (growing it if it has none); 0 at
    /// end of stream, `WouldBlock` when there is nothing to read.
    pub(crate) fn recv(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if buf.capacity() == buf.len() {
            buf.reserve(64 << 10);
        }
        os::recv(self.s.as_fd(), buf)
    }

    /// Writes `b` after whatever is queued: as much as the socket takes now, the rest queued for
    /// [`Self::flush`]. Never blocks. A peer that has gone is an error (EPIPE), never a SIGPIPE,
    /// whatever the process does with that signal.
    pub fn write(&mut self, b: &[u8]) -> io::Result<()> {
        if b.is_empty() {
            return Ok(());
        }
        if self.has_queued() {
            self.queued.extend_from_slice(b);
            return Ok(());
        }
        let n = self.send(b)?;
        if n < b.len() {
            self.queued.clear();
            self.sent = 0;
            self.queued.extend_from_slice(&b[n..]);
        }
        Ok(())
    }

    /// Sends what is queued, as far as the socket takes it.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.has_queued() {
            return Ok(());
        }
        let n = self.send(&self.queued[self.sent..])?;
        self.sent += n;
        if self.sent == self.queued.len() {
            self.queued.clear();
            self.sent = 0;
            if self.queued.capacity() > 1 << 20 {
                self.queued = Vec::new();
            }
        }
        Ok(())
    }

    /// Bytes accepted by [`Self::write`] are still waiting for room at the peer.
    pub(crate) fn has_queued(&self) -> bool {
        self.sent < self.queued.len()
    }

    /// How many bytes [`Self::write`] accepted that the peer had no room for yet.
    pub(crate) fn queued_len(&self) -> usize {
        self.queued.len() - self.sent
    }

    /// Another handle on the same socket: the watchdog shuts a stuck connection down through
    /// it ([`crate::watchdog`]).
    pub(crate) fn handle(&self) -> io::Result<UnixStream> {
        self.s.try_clone()
    }

    /// Half-closes the connection (no more writes).
    pub(crate) fn shutdown_write(&self) {
        let _ = self.s.shutdown(Shutdown::Write);
    }

    /// One `send`: how many bytes the socket took (0 when it has no room).
    fn send(&self, b: &[u8]) -> io::Result<usize> {
        os::send(self.s.as_fd(), b)
    }
}

impl AsFd for Wake {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.s.as_fd()
    }
}

/// Wakes a relay thread blocked in `poll` from any thread (an eventfd).
pub(crate) struct Wake(OwnedFd);

impl Wake {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Wake(os::eventfd()?))
    }

    /// Makes the descriptor readable (the counter saturates long before it could block).
    pub(crate) fn notify(&self) {
        os::eventfd_add_one(self.0.as_fd());
    }

    /// Resets the descriptor to not readable.
    pub(crate) fn drain(&self) {
        os::eventfd_reset(self.0.as_fd());
    }
}

pub(crate) use os::poll_entry;

/// `poll(2)` on `fds`, for at most `timeout` (rounded up to whole milliseconds); EINTR counts as
/// a return with nothing ready.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<()> {
    os::poll(fds, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_queue_when_the_peer_is_slow_and_flush_when_it_reads() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = Sock::new(a).unwrap();
        let mut r = Sock::new(b).unwrap();
        // Far more than a unix socket buffers: most of it must be queued, never block.
        let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        w.write(&big[..4 << 20]).unwrap();
        assert!(w.has_queued());
        w.write(&big[4 << 20..]).unwrap();
        let mut got = BytesMut::new();
        while got.len() < big.len() {
            w.flush().unwrap();
            match r.recv(&mut got) {
                Ok(n) => assert!(n > 0),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            }
        }
        assert!(!w.has_queued());
        assert!(got[..] == big[..]);
        w.shutdown_write();
        assert_eq!(r.recv(&mut got).unwrap(), 0);
    }

    #[test]
    fn poll_sees_the_wake_and_readable_sockets() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = Sock::new(a).unwrap();
        let wake = Wake::new().unwrap();
        let mut fds = [
            poll_entry(Some(b.as_fd()), true, false),
            poll_entry(Some(wake.as_fd()), true, false),
        ];
        poll(&mut fds, Duration::from_millis(1)).unwrap();
        assert_eq!((fds[0].revents, fds[1].revents), (0, 0));
        wake.notify();
        w.write(b"x").unwrap();
        poll(&mut fds, Duration::from_secs(5)).unwrap();
        assert_eq!(
            (fds[0].revents, fds[1].revents),
            (libc::POLLIN, libc::POLLIN)
        );
        wake.drain();
        poll(&mut fds, Duration::ZERO).unwrap();
        assert_eq!(fds[1].revents, 0);
    }
}

/// Whether the runtime's socket at `path` accepts a connection now, asked without waiting: a
/// non-blocking connect(2). A unix socket's connect completes at once or fails; with the
/// listener's backlog full (a wedged runtime that stopped accepting) a blocking one would wait
/// until the runtime accepts again, holding the relay thread out of `poll(2)` for as long —
/// the watchdog would call it stuck. Non-blocking, that is EAGAIN: not reachable yet.
pub(crate) fn accepts_connections(path: &std::path::Path) -> bool {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let Ok(addr) = SocketAddrUnix::new(path) else {
        return false;
    };
    let Ok(fd) = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    ) else {
        return false;
    };
    match rustix::net::connect(&fd, &addr) {
        Ok(()) => true,
        // Not for unix sockets today; a connection under way is one the runtime accepts.
        Err(rustix::io::Errno::INPROGRESS) => true,
        Err(_) => false,
    }
}

#[cfg(test)]
mod accepts_tests {
    use super::*;

    /// Fails on bde328c's probe (a blocking `UnixStream::connect`): with the backlog full it
    /// waits until the listener accepts, here for ever.
    #[test]
    fn a_runtime_with_a_full_backlog_is_answered_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rt.sock");
        let fd = crate::sys::socket::bind_listen_unix(&path, 0o600, None).unwrap();
        // A backlog of 0 (the kernel keeps one more), never accepted: fill it.
        rustix::net::listen(&fd, 0).unwrap();
        assert!(accepts_connections(&path), "a listening socket accepts");
        // Filled with connections never accepted (non-blocking connects of the test's own).
        let mut held = Vec::new();
        loop {
            use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
            let fd = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::STREAM,
                SocketFlags::NONBLOCK,
                None,
            )
            .unwrap();
            match rustix::net::connect(&fd, &SocketAddrUnix::new(&path).unwrap()) {
                Ok(()) => held.push(fd),
                Err(rustix::io::Errno::AGAIN) => break,
                Err(e) => panic!("connect: {e}"),
            }
            assert!(held.len() < 4096, "the backlog never filled");
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(accepts_connections(&p)));
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Ok(false),
            "a full backlog is answered within 5 s, as not reachable"
        );
        assert!(!accepts_connections(&dir.path().join("none.sock")));
    }
}
