//! `crisp tap --output FILE`: the file the tap records to. It holds every pod's traffic (and
//! secrets, with `--unredacted`), and `crisp tap` usually runs as root, so the file is opened
//! the safe way (docs/TAP.md "Recording to a file"):
//! - never through a symlink (`O_NOFOLLOW` on the last component): a link planted where the
//!   operator records cannot point the write at another file;
//! - only a regular file owned by the user running the tap, with no other hard link: a file
//!   someone else prepared (or a hard link to one crisp's user owns elsewhere) is refused, not
//!   truncated;
//! - mode 0600 whether created or reused (an existing file's mode is set to 0600 before a byte
//!   is written), then truncated.
//!
//! Every check is made on the opened descriptor (`fstat`, `fchmod`, `ftruncate`), never again by
//! name, so the file checked is the file written.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why `--output` was refused.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{0}: is a symbolic link; refusing to follow it (give the real path)")]
    Symlink(PathBuf),
    #[error("{path}: {why}; refusing to write to it")]
    Refused { path: PathBuf, why: Refusal },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// What makes an existing file unfit to record to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a regular file")]
    NotRegular,
    #[error("owned by uid {owner}, not by uid {user} running the tap")]
    NotOwned { owner: u32, user: u32 },
    #[error("it has {0} hard links")]
    Linked(u64),
}

/// The file's state as the checks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileFacts {
    pub(crate) regular: bool,
    pub(crate) owner: u32,
    pub(crate) links: u64,
}

impl From<&Metadata> for FileFacts {
    fn from(m: &Metadata) -> Self {
        FileFacts {
            regular: m.file_type().is_file(),
            owner: m.uid(),
            links: m.nlink(),
        }
    }
}

/// Whether a file with these facts may be recorded to by `user`.
pub(crate) fn check(f: FileFacts, user: u32) -> Result<(), Refusal> {
    if !f.regular {
        return Err(Refusal::NotRegular);
    }
    if f.owner != user {
        return Err(Refusal::NotOwned {
            owner: f.owner,
            user,
        });
    }
    if f.links != 1 {
        return Err(Refusal::Linked(f.links));
    }
    Ok(())
}

/// Opens (creating if need be) `path` to record to, as the module doc says.
pub fn open(path: &Path) -> Result<File, OutputError> {
    let io_err = |source: io::Error| OutputError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                OutputError::Symlink(path.to_path_buf())
            } else {
                io_err(e)
            }
        })?;
    let meta = file.metadata().map_err(io_err)?;
    let user = crate::sys::effective_uid();
    check(FileFacts::from(&meta), user).map_err(|why| OutputError::Refused {
        path: path.to_path_buf(),
        why,
    })?;
    if meta.permissions().mode() & 0o7777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_err)?;
    }
    file.set_len(0).map_err(io_err)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_private_regular_file_of_ones_own_is_written() {
        let me = FileFacts {
            regular: true,
            owner: 1000,
            links: 1,
        };
        assert_eq!(check(me, 1000), Ok(()));
        assert_eq!(
            check(FileFacts { owner: 0, ..me }, 1000),
            Err(Refusal::NotOwned {
                owner: 0,
                user: 1000
            })
        );
        assert_eq!(
            check(FileFacts { owner: 1000, ..me }, 0),
            Err(Refusal::NotOwned {
                owner: 1000,
                user: 0
            })
        );
        assert_eq!(
            check(FileFacts { links: 2, ..me }, 1000),
            Err(Refusal::Linked(2))
        );
        assert_eq!(
            check(
                FileFacts {
                    regular: false,
                    ..me
                },
                1000
            ),
            Err(Refusal::NotRegular)
        );
    }

    #[test]
    fn a_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me").unwrap();
        let link = dir.path().join("calls.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open(&link).unwrap_err();
        assert!(matches!(e, OutputError::Symlink(_)), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        // A dangling link is not followed to create its target either.
        let dangling = dir.path().join("dangling.jsonl");
        std::os::unix::fs::symlink(dir.path().join("created-elsewhere"), &dangling).unwrap();
        assert!(matches!(open(&dangling), Err(OutputError::Symlink(_))));
        assert!(!dir.path().join("created-elsewhere").exists());
    }

    #[test]
    fn an_existing_file_becomes_private_and_empty_a_new_one_is_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.jsonl");
        std::fs::write(&old, "previous recording").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open(&old).unwrap());
        let m = std::fs::metadata(&old).unwrap();
        assert_eq!((m.permissions().mode() & 0o7777, m.len()), (0o600, 0));
        let new = dir.path().join("new.jsonl");
        drop(open(&new).unwrap());
        assert_eq!(
            std::fs::metadata(&new).unwrap().permissions().mode() & 0o7777,
            0o600
        );
    }

    #[test]
    fn a_hard_linked_file_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, "keep me").unwrap();
        let link = dir.path().join("calls.jsonl");
        std::fs::hard_link(&other, &link).unwrap();
        let e = open(&link).unwrap_err();
        assert!(
            matches!(
                e,
                OutputError::Refused {
                    why: Refusal::Linked(2),
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "keep me");
    }

    #[test]
    fn a_directory_or_a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        assert!(open(dir.path()).is_err());
        let fifo = dir.path().join("fifo");
        // mkfifo(3) is mknod(2) of a FIFO.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Refused without blocking on the missing reader (O_NONBLOCK: ENXIO, or not regular).
        assert!(open(&fifo).is_err());
    }
}
