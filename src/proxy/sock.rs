//! The relay's two sockets, registered with the reactor for *read* readiness only.
//!
//! tokio registers every `UnixStream` for both read and write readiness (edge-triggered). On a
//! unix socket, each time the peer reads what crisp wrote the kernel signals write space, so
//! crisp's reactor thread was woken once more per batch with nothing to do: 27 % of crisp's
//! `epoll_wait` returns carried only EPOLLOUT at concurrency 64 (strace, fake runtime). A
//! byte splice such as socat asks for write readiness only when a write would block; so does
//! this: writes go straight to the socket, and only one that finds the send buffer full
//! registers a duplicate of the descriptor for write readiness until it has room again.

use std::io;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Splits a connected stream into a reader and a writer that share one read-only registration.
pub fn split(stream: tokio::net::UnixStream) -> io::Result<(Reader, Writer)> {
    // `into_std` deregisters it from tokio and leaves it non-blocking.
    let std = stream.into_std()?;
    // SAFETY: the AsyncFd owns the stream, so its descriptor stays open, and the same, for as
    // long as the registration exists.
    let fd = Arc::new(unsafe { AsyncFd::register_with_interest(std, Interest::READABLE) }?);
    Ok((Reader { fd: fd.clone() }, Writer { fd }))
}

/// The reading side.
pub struct Reader {
    fd: Arc<AsyncFd<StdUnixStream>>,
}

impl Reader {
    /// Reads what the socket has into `buf`'s spare capacity (growing it if it has none); 0 at
    /// end of stream. Cancel-safe: nothing is read unless the call returns.
    pub async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        self.recv(buf, usize::MAX).await
    }

    /// Reads exactly `out.len()` bytes (the HTTP/2 preface), and nothing past them.
    pub async fn read_exact(&mut self, out: &mut [u8]) -> io::Result<()> {
        let mut buf = BytesMut::with_capacity(out.len());
        while buf.len() < out.len() {
            let want = out.len() - buf.len();
            if self.recv(&mut buf, want).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        out.copy_from_slice(&buf);
        Ok(())
    }

    /// Reads at most `max` bytes into `buf`'s spare capacity.
    async fn recv(&mut self, buf: &mut BytesMut, max: usize) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_recv(cx, buf, max)).await
    }

    /// [`Self::recv`] as a poll: the waker goes into the registration's one reader slot (no
    /// waiter is queued and dequeued per read, as a `readable()` future does), so a relayed
    /// hop costs one readiness check. Nothing is read unless this returns `Ready`.
    fn poll_recv(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut, max: usize) -> Poll<io::Result<usize>> {
        if buf.capacity() == buf.len() {
            buf.reserve(64 << 10);
        }
        loop {
            let mut guard = match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let dst = buf.chunk_mut();
            let room = dst.len().min(max);
            let ptr = dst.as_mut_ptr();
            let res = guard.try_io(|inner| {
                // SAFETY: `ptr` points to at least `room` writable bytes of `buf`'s spare
                // capacity, which nothing else aliases while this runs; recv writes at most
                // `room` bytes there.
                let n = unsafe { libc::recv(inner.get_ref().as_raw_fd(), ptr.cast(), room, 0) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match res {
                Ok(Ok(n)) => {
                    // SAFETY: recv initialised the first `n` (≤ `room`) bytes of the spare capacity.
                    unsafe { buf.advance_mut(n) };
                    if n > 0 && n < room {
                        // A short read emptied the socket: skip the recv that would only say
                        // EAGAIN. (tokio ignores this clear if an event arrived meanwhile.)
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(n));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // WouldBlock: readiness was cleared; poll again for the next edge.
                Err(_) => continue,
            }
        }
    }
}

/// The writing side.
pub struct Writer {
    fd: Arc<AsyncFd<StdUnixStream>>,
}

impl Writer {
    /// Writes all of `b`, waiting for room in the send buffer when it is full. A peer that has
    /// gone is an error (EPIPE), never a SIGPIPE, whatever the process does with that signal.
    pub async fn write_all(&mut self, mut b: &[u8]) -> io::Result<()> {
        while !b.is_empty() {
            // SAFETY: `b` is a valid slice of `b.len()` bytes for the duration of the call.
            let n = unsafe { libc::send(self.fd.as_raw_fd(), b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
            let r = if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => b = &b[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait_writable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits until the socket has room to send: a registration of its own, for write readiness,
    /// that lasts only as long as a write is blocked. (An edge-triggered registration reports the
    /// socket writable at once if room appeared since the failed write: no wakeup is lost.)
    async fn wait_writable(&self) -> io::Result<()> {
        let dup = self.fd.get_ref().try_clone()?;
        // SAFETY: as in `split`: the AsyncFd owns the duplicate descriptor it registers.
        let w = unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE) }?;
        let _ready = w.writable().await?;
        Ok(())
    }

    /// Half-closes the connection (no more writes).
    pub async fn shutdown(&mut self) -> io::Result<()> {
        match self.fd.get_ref().shutdown(Shutdown::Write) {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_writes_and_waits_for_room_when_the_peer_is_slow() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut ar, mut aw) = split(a).unwrap();
        let (mut br, mut bw) = split(b).unwrap();
        // Far more than a unix socket buffers: the writer must wait for the reader.
        let big: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            aw.write_all(&sent).await.unwrap();
            aw.shutdown().await.unwrap();
        });
        let mut got = BytesMut::new();
        loop {
            let n = br.read_buf(&mut got).await.unwrap();
            if n == 0 {
                break;
            }
        }
        writer.await.unwrap();
        assert_eq!(got.len(), big.len());
        assert!(got[..] == big[..]);
        // The other direction, and read_exact reading no further than asked.
        bw.write_all(b"PRI * HTTP/2.0 and more").await.unwrap();
        let mut pre = [0u8; 14];
        ar.read_exact(&mut pre).await.unwrap();
        assert_eq!(&pre, b"PRI * HTTP/2.0");
        let mut rest = BytesMut::new();
        ar.read_buf(&mut rest).await.unwrap();
        assert_eq!(&rest[..], b" and more");
    }

    #[tokio::test]
    async fn end_of_stream_reads_zero_and_read_exact_fails() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (mut ar, _aw) = split(a).unwrap();
        let (_br, mut bw) = split(b).unwrap();
        bw.write_all(b"abc").await.unwrap();
        bw.shutdown().await.unwrap();
        let mut pre = [0u8; 5];
        assert_eq!(ar.read_exact(&mut pre).await.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
