//! `crisp tap --output FILE`: the file the tap records to. It holds every pod's traffic (and
//! secrets, with `--unredacted`), and `crisp tap` usually runs as root, so the file is opened
//! the safe way (docs/TAP.md "Recording to a file"):
//! - never through a symlink anywhere on the path: `openat2(2)` with `RESOLVE_NO_SYMLINKS`, or,
//!   where the kernel has no `openat2` (before Linux 5.6: `ENOSYS`), the same rule by a walk
//!   that opens each directory with `O_NOFOLLOW` relative to the one before. A link planted in
//!   any directory of the path (`~user/dir` → `/etc`) cannot point the write at another file;
//! - an existing file is never replaced unless asked (`--force`); even then, only a regular
//!   file owned by the user running the tap, with no other hard link: a file someone else
//!   prepared (or a hard link to one crisp's user owns elsewhere) is refused, left as it was;
//! - with `--force` the recording goes to a new file, created 0600 in the same directory and
//!   renamed over the old one (issue #44): the old file is never truncated or written, so a
//!   reader that opened it earlier (it may have been 0644) keeps reading the old recording and
//!   never sees the new one, `--unredacted` included;
//! - mode 0600, set on the descriptor before a byte is written.
//!
//! Every check is made on an opened descriptor (`fstat`, `fchmod`), and the new file is created
//! and renamed relative to the directory opened without following a symlink, never again by a
//! path the kernel resolves afresh.

use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};

/// Why `--output` was refused.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "{0}: the path goes through a symbolic link; refusing to follow any (give the real \
         path, e.g. from `realpath`)"
    )]
    Symlink(PathBuf),
    #[error("{0}: the file exists; refusing to overwrite it (pass --force to replace it)")]
    Exists(PathBuf),
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

/// Opens (creating if need be) `path` to record to, as the module doc says; an existing file
/// only with `force`.
pub fn open(path: &Path, force: bool) -> Result<File, OutputError> {
    open_with(path, force, open_beneath_no_symlinks)
}

/// How a path is opened without following a symlink: `openat2`, or the walk.
type Opener = fn(&Path, OFlags) -> io::Result<OwnedFd>;

fn open_with(path: &Path, force: bool, opener: Opener) -> Result<File, OutputError> {
    let io_err = |source: io::Error| OutputError::Io {
        path: path.to_path_buf(),
        source,
    };
    if force {
        return replace_with(path, opener);
    }
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::EXCL;
    let file = File::from(opener(path, flags).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => OutputError::Symlink(path.to_path_buf()),
        // O_EXCL does not follow a symlink in the last place either: say which it is.
        Some(libc::EEXIST) if is_symlink(path) => OutputError::Symlink(path.to_path_buf()),
        Some(libc::EEXIST) => OutputError::Exists(path.to_path_buf()),
        _ => io_err(e),
    })?);
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

/// `--force`: the existing file at `path` (if any) is checked as [`check`] says and left
/// untouched; a new file is created 0600 next to it and renamed over it.
fn replace_with(path: &Path, opener: Opener) -> Result<File, OutputError> {
    let io_err = |source: io::Error| OutputError::Io {
        path: path.to_path_buf(),
        source,
    };
    let Some(name) = path.file_name() else {
        // "/", "..": a directory, which the checks refuse anyway.
        return Err(OutputError::Refused {
            path: path.to_path_buf(),
            why: Refusal::NotRegular,
        });
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir =
        opener(parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC).map_err(|e| match e
            .raw_os_error()
        {
            Some(libc::ELOOP) => OutputError::Symlink(path.to_path_buf()),
            // O_NOFOLLOW | O_DIRECTORY on a symlink to a directory: the link, not a directory.
            Some(libc::ENOTDIR) if is_symlink(parent) => OutputError::Symlink(path.to_path_buf()),
            _ => io_err(e),
        })?;
    // The file to be replaced: checked on a descriptor of the entry itself (a symlink is opened
    // as itself with O_PATH | O_NOFOLLOW, and refused).
    match rustix::fs::openat(
        &dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(old) => {
            let st = rustix::fs::fstat(&old).map_err(|e| io_err(e.into()))?;
            let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
            if kind == rustix::fs::FileType::Symlink {
                return Err(OutputError::Symlink(path.to_path_buf()));
            }
            let facts = FileFacts {
                regular: kind == rustix::fs::FileType::RegularFile,
                owner: st.st_uid,
                links: st.st_nlink,
            };
            check(facts, crate::sys::effective_uid()).map_err(|why| OutputError::Refused {
                path: path.to_path_buf(),
                why,
            })?;
        }
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io_err(e.into())),
    }
    let mut tmp = name.to_os_string();
    tmp.push(format!(".crisp-tap-{}.tmp", std::process::id()));
    let fd = rustix::fs::openat(
        &dir,
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io_err(e.into()))?;
    let file = File::from(fd);
    let done = file
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| Ok(rustix::fs::renameat(&dir, &tmp, &dir, name)?));
    if let Err(e) = done {
        let _ = rustix::fs::unlinkat(&dir, &tmp, rustix::fs::AtFlags::empty());
        return Err(io_err(e));
    }
    Ok(file)
}

/// For the error message only: the file's own checks are made on its descriptor.
fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// `openat2(path, flags | O_NOFOLLOW, 0600, RESOLVE_NO_SYMLINKS)`: `ELOOP` if any component of
/// the path is a symlink. Kernels without `openat2` (`ENOSYS`) get [`open_by_walk`].
fn open_beneath_no_symlinks(path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    match rustix::fs::openat2(
        CWD,
        path,
        flags | OFlags::NOFOLLOW,
        create_mode(flags),
        ResolveFlags::NO_SYMLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => open_by_walk(path, flags),
        r => r.map_err(io::Error::from),
    }
}

/// The walk `openat2` stands for: from `/` (or the working directory), each directory of the
/// path opened `O_PATH | O_NOFOLLOW` relative to the one before and refused (`ELOOP`) if it is
/// a symlink; the file itself opened `O_NOFOLLOW` in the last directory. `..` is walked as the
/// kernel walks it (it is never a link).
fn open_by_walk(path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let dir_flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut parts: Vec<Component<'_>> = path.components().collect();
    let Some(Component::Normal(name)) = parts.pop() else {
        // "/", "." or "..": a directory, which the checks refuse anyway.
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    };
    let mut dir: OwnedFd =
        rustix::fs::openat(CWD, ".", dir_flags | OFlags::DIRECTORY, Mode::empty())?;
    for part in parts {
        let step: &OsStr = match part {
            Component::RootDir => {
                dir = rustix::fs::openat(CWD, "/", dir_flags | OFlags::DIRECTORY, Mode::empty())?;
                continue;
            }
            Component::CurDir | Component::Prefix(_) => continue,
            Component::ParentDir => OsStr::new(".."),
            Component::Normal(n) => n,
        };
        let next = rustix::fs::openat(&dir, step, dir_flags, Mode::empty())?;
        let kind = rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&next)?.st_mode);
        match kind {
            rustix::fs::FileType::Directory => dir = next,
            rustix::fs::FileType::Symlink => return Err(io::Error::from_raw_os_error(libc::ELOOP)),
            _ => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
    }
    Ok(rustix::fs::openat(
        &dir,
        name,
        flags | OFlags::NOFOLLOW,
        create_mode(flags),
    )?)
}

/// 0600 for a file being created; none otherwise (`openat2` refuses a mode without `O_CREAT`).
fn create_mode(flags: OFlags) -> Mode {
    if flags.contains(OFlags::CREATE) {
        Mode::from_raw_mode(0o600)
    } else {
        Mode::empty()
    }
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
        for force in [false, true] {
            let e = open(&link, force).unwrap_err();
            assert!(matches!(e, OutputError::Symlink(_)), "{e}");
        }
        let e = open(&link, true).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        // A dangling link is not followed to create its target either.
        let dangling = dir.path().join("dangling.jsonl");
        std::os::unix::fs::symlink(dir.path().join("created-elsewhere"), &dangling).unwrap();
        for force in [false, true] {
            assert!(matches!(
                open(&dangling, force),
                Err(OutputError::Symlink(_))
            ));
        }
        assert!(!dir.path().join("created-elsewhere").exists());
    }

    #[test]
    fn an_existing_file_becomes_private_and_empty_a_new_one_is_created_private() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.jsonl");
        std::fs::write(&old, "previous recording").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(open(&old, true).unwrap());
        let m = std::fs::metadata(&old).unwrap();
        assert_eq!((m.permissions().mode() & 0o7777, m.len()), (0o600, 0));
        let new = dir.path().join("new.jsonl");
        drop(open(&new, false).unwrap());
        assert_eq!(
            std::fs::metadata(&new).unwrap().permissions().mode() & 0o7777,
            0o600
        );
    }

    /// Issue #44: `--force` renames a new file over the old one. A reader that opened the old
    /// (0644) file before reads the old recording to its end and never the new one. On bde328c
    /// the old file was truncated and reused: the reader read the new recording.
    #[test]
    fn force_replaces_the_file_and_a_reader_of_the_old_one_never_sees_the_new() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calls.jsonl");
        std::fs::write(&path, "old recording\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut reader = File::open(&path).unwrap();
        let mut f = open(&path, true).unwrap();
        f.write_all(b"new secret recording\n").unwrap();
        drop(f);
        let mut seen = String::new();
        reader.read_to_string(&mut seen).unwrap();
        assert_eq!(seen, "old recording\n");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "new secret recording\n"
        );
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o600);
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_hard_linked_file_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, "keep me").unwrap();
        let link = dir.path().join("calls.jsonl");
        std::fs::hard_link(&other, &link).unwrap();
        let e = open(&link, true).unwrap_err();
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
        assert!(open(dir.path(), true).is_err());
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
        assert!(open(&fifo, true).is_err());
    }

    /// Both ways of opening: `openat2`, and the walk kernels without it get.
    const OPENERS: [(&str, Opener); 2] = [
        ("openat2", open_beneath_no_symlinks),
        ("walk", open_by_walk),
    ];

    /// Issue #33: a symlinked *directory* on the path (`~user/dir` → a root-owned directory)
    /// is refused like a symlinked file: nothing is created or truncated behind it.
    #[test]
    fn a_symlink_anywhere_on_the_path_is_refused() {
        for (how, opener) in OPENERS {
            let dir = tempfile::tempdir().unwrap();
            let real = dir.path().join("real");
            std::fs::create_dir(&real).unwrap();
            std::fs::write(real.join("precious"), "keep me").unwrap();
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&real, &link).unwrap();
            for (path, force) in [
                (link.join("calls.jsonl"), false),
                (link.join("precious"), true),
                (link.join("..").join("real").join("precious"), true),
                (link.join("sub").join("calls.jsonl"), true),
            ] {
                let e = open_with(&path, force, opener).unwrap_err();
                assert!(matches!(e, OutputError::Symlink(_)), "{how}: {e}");
                assert!(
                    e.to_string().contains(&path.display().to_string())
                        && e.to_string().contains("symbolic link"),
                    "{how}: {e}"
                );
            }
            assert!(!real.join("calls.jsonl").exists(), "{how}");
            let kept = std::fs::read_to_string(real.join("precious")).unwrap();
            assert_eq!(kept, "keep me", "{how}");
            // The real path is fine, relative ones too.
            drop(open_with(&real.join("calls.jsonl"), false, opener).unwrap());
            let rel = real.strip_prefix("/").unwrap();
            let up = "../".repeat(std::env::current_dir().unwrap().components().count());
            let relative = Path::new(&up).join(rel).join("rel.jsonl");
            drop(open_with(&relative, false, opener).unwrap());
            assert!(real.join("rel.jsonl").exists(), "{how}");
        }
    }

    /// Issue #33: an existing file is never truncated without `--force`.
    #[test]
    fn an_existing_file_is_refused_without_force_and_left_as_it_was() {
        for (how, opener) in OPENERS {
            let dir = tempfile::tempdir().unwrap();
            let old = dir.path().join("old.jsonl");
            std::fs::write(&old, "previous recording").unwrap();
            let e = open_with(&old, false, opener).unwrap_err();
            assert!(matches!(e, OutputError::Exists(_)), "{how}: {e}");
            assert!(
                e.to_string().contains(&old.display().to_string())
                    && e.to_string().contains("--force"),
                "{how}: {e}"
            );
            assert_eq!(std::fs::read_to_string(&old).unwrap(), "previous recording");
            drop(open_with(&old, true, opener).unwrap());
            assert_eq!(std::fs::metadata(&old).unwrap().len(), 0, "{how}");
        }
    }
}
