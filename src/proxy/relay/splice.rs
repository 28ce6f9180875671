//! The floor a benchmark measures crisp against on the same machine: a connection spliced byte
//! for byte on its relay thread, the core left out (issue #47's "physical floor").
//!
//! Set `CRISP_RELAY_SPLICE=1` in crisp's environment and every relayed connection, after the
//! same accept, preface and runtime connection as always, is copied both ways by the same
//! `poll(2)`, `recv` and `send` the pump uses, with nothing read: no routing, no ordering, no
//! tap, no metrics. What crisp adds over this is what its protocol work costs; what this adds
//! over a direct connection is the hop itself (two sockets, one thread's wakeups). It is for
//! benchmarks only — it turns off everything crisp is for — so crisp says so loudly at start.
//! A connection crisp serves on the observed path (no runtime connection) is not spliced.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;

use super::bridge::Outbox;
use super::LOG;
use crate::proxy::sock::{self, Sock};

/// The environment variable that turns the splice on.
pub(crate) const ENV: &str = "CRISP_RELAY_SPLICE";

/// Whether crisp's environment asks for the splice (`1`); says so in the log when it does.
pub(crate) fn from_env() -> bool {
    let on = std::env::var_os(ENV).is_some_and(|v| v == "1");
    if on {
        tracing::warn!(
            target: LOG,
            "{ENV}=1: every relayed connection is spliced byte for byte, and nothing is ordered, \
             tapped or counted; a benchmark's floor, never for a node"
        );
    }
    on
}

/// How long a `poll` waits before the stop flags are read again.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// Copies `client` ⇄ `runtime` until either closes or crisp stops (the `outbox`'s flags, its
/// eventfd waking the `poll`). Backpressure as in the pump: a side is not read while the other
/// has bytes of it queued.
pub(super) fn run(client: &mut Sock, runtime: &mut Sock, outbox: &Outbox) -> io::Result<()> {
    let mut buf = BytesMut::with_capacity(64 << 10);
    loop {
        if outbox.kill.load(Ordering::Acquire) || outbox.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut fds = [
            sock::poll_entry(
                Some(client.as_fd()),
                !runtime.has_queued(),
                client.has_queued(),
            ),
            sock::poll_entry(Some(outbox.wake.as_fd()), true, false),
            sock::poll_entry(
                Some(runtime.as_fd()),
                !client.has_queued(),
                runtime.has_queued(),
            ),
        ];
        sock::poll(&mut fds, STOP_CHECK)?;
        let [c, w, r] = fds.map(|p| p.revents);
        if w != 0 {
            outbox.wake.drain();
        }
        if c & libc::POLLOUT != 0 {
            client.flush()?;
        }
        if r & libc::POLLOUT != 0 {
            runtime.flush()?;
        }
        if c & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            && !copy(client, runtime, &mut buf)?
        {
            return Ok(());
        }
        if r & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            && !copy(runtime, client, &mut buf)?
        {
            return Ok(());
        }
    }
}

/// One read of `from`, written to `to`: false at `from`'s end of stream.
fn copy(from: &mut Sock, to: &mut Sock, buf: &mut BytesMut) -> io::Result<bool> {
    buf.clear();
    match from.recv(buf) {
        Ok(0) => Ok(false),
        Ok(_) => {
            to.write(buf)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use super::*;
    use crate::proxy::sock::Wake;

    #[test]
    fn bytes_cross_both_ways_unread_until_crisp_stops() {
        let (mut kubelet, client) = UnixStream::pair().unwrap();
        let (runtime, mut containerd) = UnixStream::pair().unwrap();
        let outbox = Arc::new(Outbox::new(Wake::new().unwrap()));
        let thread = std::thread::spawn({
            let outbox = outbox.clone();
            move || {
                let (mut c, mut r) = (Sock::new(client).unwrap(), Sock::new(runtime).unwrap());
                run(&mut c, &mut r, &outbox)
            }
        });
        // Not HTTP/2: the core would end the connection on it; the splice never reads it.
        kubelet.write_all(b"no frame at all").unwrap();
        let mut got = [0u8; 15];
        containerd.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"no frame at all");
        // A large answer: the client side takes it in several writes.
        let answer = vec![7u8; 1 << 20];
        let writer = std::thread::spawn(move || containerd.write_all(&answer).map(|()| containerd));
        let mut back = vec![0u8; 1 << 20];
        kubelet.read_exact(&mut back).unwrap();
        assert!(back.iter().all(|&b| b == 7));
        let _containerd = writer.join().unwrap().unwrap();
        outbox.stop.store(true, Ordering::Release);
        outbox.wake.notify();
        thread.join().unwrap().unwrap();
    }

    #[test]
    fn it_ends_when_the_client_closes() {
        let (kubelet, client) = UnixStream::pair().unwrap();
        let (runtime, _containerd) = UnixStream::pair().unwrap();
        let outbox = Outbox::new(Wake::new().unwrap());
        drop(kubelet);
        let (mut c, mut r) = (Sock::new(client).unwrap(), Sock::new(runtime).unwrap());
        run(&mut c, &mut r, &outbox).unwrap();
    }
}
