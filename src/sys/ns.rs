//! Linux namespaces: what kind a namespace file is, and moving a thread into one.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use rustix::thread::LinkNameSpaceType;

/// `NS_GET_NSTYPE` (linux/nsfs.h: `_IO(0xb7, 0x3)`): the type of namespace a file refers to.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The kind of namespace `file` refers to, as a `CLONE_NEW*` value (`libc::CLONE_NEWNET` for a
/// network namespace); an error (ENOTTY, EINVAL) for a file that is no namespace.
pub(crate) fn kind(file: impl AsFd) -> io::Result<i32> {
    let fd = file.as_fd();
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor's namespace; `fd` is
    // borrowed, so it stays open for the duration of the call. On any other file the kernel
    // refuses the request (ENOTTY) without touching it.
    let kind = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) };
    if kind < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(kind)
}

/// Moves the calling thread into the network namespace `ns` refers to (setns(2) checks that it
/// is one). Only this thread moves: network namespaces may be entered by one thread of a
/// multi-threaded process.
pub(crate) fn enter_network(ns: impl AsFd) -> io::Result<()> {
    Ok(rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(LinkNameSpaceType::Network),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_files_have_a_kind_and_other_files_none() {
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        assert_eq!(kind(&net).unwrap(), libc::CLONE_NEWNET);
        let uts = std::fs::File::open("/proc/self/ns/uts").unwrap();
        assert_eq!(kind(&uts).unwrap(), libc::CLONE_NEWUTS);
        let status = std::fs::File::open("/proc/self/status").unwrap();
        assert!(kind(&status).is_err());
        // setns(2) refuses a namespace of another kind than the one asked for.
        assert!(enter_network(&uts).is_err());
    }
}
