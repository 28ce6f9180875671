//! The relay's writer never raises SIGPIPE: a client (kubelet) or runtime that hangs up while
//! crisp writes to it is an error for that connection, not the end of the daemon. This runs in a
//! process of its own because it restores SIGPIPE's default action (terminate), which Rust
//! programs otherwise ignore: with a plain write(2) this test process would be killed.

use crisp::proxy::sock::Sock;

#[test]
fn writing_to_a_peer_that_hung_up_is_an_error_not_a_signal() {
    // SAFETY: setting a signal's disposition to its default is async-signal-safe and touches no
    // Rust state; this test binary has no other test.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut aw = Sock::new(a).unwrap();
    drop(b);
    let mut last = Ok(());
    // The first write may land in the socket buffer before the kernel notices; keep writing.
    for _ in 0..4 {
        last = aw.write(&[0u8; 4096]).and_then(|()| aw.flush());
        if last.is_err() {
            break;
        }
    }
    assert_eq!(last.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
}
