//! Descriptors inherited at start: the listening sockets systemd passes (sd_listen_fds(3)).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

static TAKEN: AtomicBool = AtomicBool::new(false);

/// The sockets systemd passed to this process, owned from here on, in the order systemd
/// announced them; empty when there are none or `LISTEN_PID` names another process. Once per
/// process: a later call returns None, since each descriptor may have one owner only.
///
/// sd-notify reads `LISTEN_PID` and `LISTEN_FDS` and marks every announced descriptor
/// close-on-exec; a malformed value, or an announced descriptor that is not open, is its error.
pub fn take_listen_fds() -> Option<io::Result<Vec<OwnedFd>>> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return None;
    }
    let fds = sd_notify::listen_fds().map(|fds| {
        fds.map(|fd| {
            // SAFETY: sd-notify returned `fd` only because LISTEN_PID is this process and the fd
            // is in the range LISTEN_FDS announces from 3 on, which systemd opened for this
            // process before it started (nothing in crisp opened or owns it); it is open, since
            // marking it close-on-exec succeeded. TAKEN makes this the one place that takes it.
            unsafe { OwnedFd::from_raw_fd(fd) }
        })
        .collect()
    });
    Some(fds)
}
