//! Every call crisp makes into the operating system that Rust's standard library does not make
//! for it: sockets and the relay's `poll(2)`, namespaces, descriptors inherited from systemd,
//! the process's user and umask.
//!
//! Descriptors cross this module's boundary as [`std::os::fd::OwnedFd`] (whoever holds it closes
//! it) or borrowed ([`std::os::fd::AsFd`], [`std::os::fd::BorrowedFd`]), so that ownership is in
//! the types: no caller hands over a bare number and hopes it was theirs to give.
//!
//! Most calls go through rustix, whose calls are safe and as thin as libc's. What is left is
//! `unsafe`, each block with the proof of its conditions next to it, and is the only `unsafe` in
//! the crate (lib.rs denies it everywhere else):
//!
//! - [`socket::recv`]: reads into a buffer's spare capacity, then marks those bytes as filled
//!   (the relay's hot path; zeroing the buffer first would cost a pass over every byte);
//! - [`socket::poll`]: `poll(2)` on the relay's `pollfd` array, where an entry's negative
//!   descriptor means "skip it", which rustix's typed `PollFd` cannot say;
//! - [`ns::kind`]: the `NS_GET_NSTYPE` ioctl, which has no safe wrapper;
//! - [`inherit::take_listen_fds`]: taking ownership of the descriptors systemd passed.

pub(crate) mod inherit;
pub(crate) mod net;
pub(crate) mod ns;
pub(crate) mod socket;

/// The process's effective user id.
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}
