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
//! - [`inherit::take_listen_fds`]: taking ownership of the descriptors systemd passed;
//! - [`group_id`]: `getgrnam_r(3)` (the admin socket's `admin.group`), which rustix lacks.

pub(crate) mod inherit;
pub(crate) mod net;
pub(crate) mod ns;
pub(crate) mod socket;

/// The process's effective user id.
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The process's effective group id.
#[cfg(any(test, feature = "test-util"))]
pub fn effective_gid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// The id of the group named `name` (`getgrnam_r(3)`: /etc/group or whatever NSS is configured
/// with), `None` when there is no such group.
pub fn group_id(name: &str) -> std::io::Result<Option<u32>> {
    let c_name = std::ffi::CString::new(name).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("group name {name:?} contains a NUL byte"),
        )
    })?;
    let mut buf = vec![0u8; 1024];
    loop {
        let mut group = std::mem::MaybeUninit::<libc::group>::uninit();
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: `c_name` is NUL-terminated and outlives the call; `group` is writable storage
        // for one `struct group`, `buf` is writable for `buf.len()` bytes (the strings `group`
        // points into), `found` a writable pointer; getgrnam_r writes nothing else, and sets
        // `found` to `group` or null.
        let rc = unsafe {
            libc::getgrnam_r(
                c_name.as_ptr(),
                group.as_mut_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut found,
            )
        };
        match rc {
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            // getgrnam_r(3): these also mean "not found" on some systems.
            0 | libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM if found.is_null() => {
                return Ok(None)
            }
            // SAFETY: getgrnam_r succeeded and `found` points at `group`, which it filled.
            0 => return Ok(Some(unsafe { (*found).gr_gid })),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}
