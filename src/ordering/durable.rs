//! The one writer of crisp's state directory (Job-mode marks, held-call intents): the way
//! kubelet writes its checkpoints — a temporary file, renamed over the target — so a reader (a
//! restarted crisp) sees the old content or the new, never a part of either.
//!
//! How far a write must survive is the caller's ([`Durability`]): a Job mark must survive a
//! power loss (the temporary file and the directory are fsynced), a held call's intent only
//! crisp's own death (the page cache outlives a killed process; a power loss ends every
//! container an intent could name, so an fsync would buy nothing and cost the held call
//! milliseconds before it is forwarded: RELIABILITY.md, "intents").
//!
//! Tests observe the steps through `hook` (a test-only fault hook: it may fail a step, as a full
//! disk or a crash between two steps would).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a file could not be written durably.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot sync the directory {path}: {source}")]
    SyncDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A file being written; one a crash left before its rename is removed when its directory is
/// opened.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// Numbers each write's temporary file, so two writes of one name at once (two Job pods'
/// `check_writable` probes, a mark written twice) never share one: with a shared name, the
/// first rename takes the second's file away and the second fails with ENOENT.
static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a write must survive once it is reported done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// crisp's own death (SIGKILL, a panic, the watchdog's abort): written and renamed, never
    /// fsynced. A restarted crisp reads it from the page cache.
    CrispDeath,
    /// A power loss too: the temporary file fsynced before the rename, the directory after it.
    PowerLoss,
}

/// The steps of [`write()`], as the test hook sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The temporary file is written in full (and fsynced under [`Durability::PowerLoss`]);
    /// the target is not touched yet.
    Written,
    /// The rename is done (the directory not fsynced yet).
    Renamed,
    /// The directory is fsynced ([`Durability::PowerLoss`] only): the write is done.
    DirSynced,
}

#[cfg(test)]
type Hook = Box<dyn FnMut(Step, &Path) -> std::io::Result<()>>;

#[cfg(test)]
thread_local! {
    static HOOK: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
}

/// Calls `f` at each [`Step`] of the writes made on this thread (with the target's path) until
/// the returned guard is dropped; an error from `f` fails the write at that step.
#[cfg(test)]
pub(crate) fn hook(f: impl FnMut(Step, &Path) -> std::io::Result<()> + 'static) -> impl Drop {
    struct Unhook;
    impl Drop for Unhook {
        fn drop(&mut self) {
            HOOK.with(|h| h.borrow_mut().take());
        }
    }
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    Unhook
}

#[cfg(test)]
fn step(step: Step, path: &Path) -> std::io::Result<()> {
    HOOK.with(|h| match h.borrow_mut().as_mut() {
        Some(f) => f(step, path),
        None => Ok(()),
    })
}

#[cfg(not(test))]
#[inline(always)]
fn step(_: Step, _: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Writes `content` to `dir/name` so that it survives a power loss ([`Durability::PowerLoss`]).
pub(crate) fn write_durably(dir: &Path, name: &str, content: &[u8]) -> Result<(), WriteError> {
    write(dir, name, content, Durability::PowerLoss)
}

/// Writes `content` to `dir/name`: a temporary file, renamed over `name` (under
/// [`Durability::PowerLoss`] the temporary file fsynced before the rename, and the directory
/// after it, so that the rename itself is on disk). A failed write leaves the old content (if
/// any) in place and no temporary file. Blocking: called off the async workers.
pub(crate) fn write(
    dir: &Path,
    name: &str,
    content: &[u8],
    durability: Durability,
) -> Result<(), WriteError> {
    let seq = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.{seq}{TMP_SUFFIX}"));
    let path = dir.join(name);
    let power_loss = durability == Durability::PowerLoss;
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(content)?;
        if power_loss {
            file.sync_all()?;
        }
        step(Step::Written, &path)?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(source) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(WriteError::Write { path, source });
    }
    let sync_dir = || -> std::io::Result<()> {
        step(Step::Renamed, &path)?;
        if power_loss {
            std::fs::File::open(dir)?.sync_all()?;
            step(Step::DirSynced, &path)?;
        }
        Ok(())
    };
    sync_dir().map_err(|source| WriteError::SyncDir {
        path: dir.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// Issue #43 item 7: what a crash between the steps would leave. Until the rename, the
    /// target holds its old content in full and no part of the new one is visible under its
    /// name; after it, the new content in full — under both durabilities. A plain `fs::write`
    /// (the target truncated and written in place) fails this test: the hook never sees
    /// `Written` with the old content intact, and the fault below does not keep the old content.
    #[test]
    fn a_write_is_old_or_new_never_partial_at_every_step() {
        for (durability, steps) in [
            (
                Durability::PowerLoss,
                &[Step::Written, Step::Renamed, Step::DirSynced][..],
            ),
            (Durability::CrispDeath, &[Step::Written, Step::Renamed][..]),
        ] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f"), b"old content").unwrap();
            let seen = Rc::new(RefCell::new(Vec::new()));
            let _hook = hook({
                let seen = seen.clone();
                move |step, path| {
                    let now = std::fs::read(path).unwrap();
                    seen.borrow_mut().push((step, now));
                    Ok(())
                }
            });
            write(dir.path(), "f", b"new content, longer", durability).unwrap();
            let seen = seen.borrow();
            assert_eq!(
                seen.iter().map(|s| s.0).collect::<Vec<_>>(),
                steps,
                "{durability:?}: the directory is fsynced only for a power loss"
            );
            assert_eq!(
                seen[0].1, b"old content",
                "{durability:?}: old until the rename"
            );
            for (step, content) in &seen[1..] {
                assert_eq!(
                    content, b"new content, longer",
                    "{durability:?} at {step:?}"
                );
            }
            assert_eq!(names(dir.path()), vec!["f".to_string()]);
        }
    }

    /// A fault between the written temporary file and the rename (a full disk, a crash): the
    /// write fails, the old content is intact, and no temporary file is left.
    #[test]
    fn a_fault_before_the_rename_keeps_the_old_content() {
        for durability in [Durability::PowerLoss, Durability::CrispDeath] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f"), b"old").unwrap();
            let _hook = hook(|step, _| match step {
                Step::Written => Err(std::io::Error::other("injected: crash before the rename")),
                _ => Ok(()),
            });
            let e = write(dir.path(), "f", b"new", durability).unwrap_err();
            assert!(matches!(e, WriteError::Write { .. }), "{e}");
            assert!(e.to_string().contains("injected"), "{e}");
            assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"old");
            assert_eq!(names(dir.path()), vec!["f".to_string()]);
        }
    }

    /// Two writes of one name at once both succeed, and leave one file. Seen in the chaos lane
    /// (a Job pod's sidecar never ended): two Job pods' `check_writable` probes shared one
    /// temporary file, the first rename took it away, and the second failed with "No such file
    /// or directory" — so job mode refused to stop that pod's sidecars. Here the first write is
    /// paused between its temporary file and its rename while the second runs in full.
    #[test]
    fn two_writes_of_one_name_at_once_both_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let (at_written, paused) = std::sync::mpsc::channel::<()>();
        let (go_on, resume) = std::sync::mpsc::channel::<()>();
        let first = std::thread::spawn({
            let dir = dir.path().to_path_buf();
            move || {
                let _hook = hook(move |step, _| {
                    if step == Step::Written {
                        at_written.send(()).unwrap();
                        resume.recv().unwrap();
                    }
                    Ok(())
                });
                write_durably(&dir, ".probe", b"first")
            }
        });
        paused.recv().unwrap();
        write_durably(dir.path(), ".probe", b"second").expect("the second write");
        go_on.send(()).unwrap();
        first.join().unwrap().expect("the first write");
        assert_eq!(names(dir.path()), vec![".probe".to_string()]);
        assert_eq!(std::fs::read(dir.path().join(".probe")).unwrap(), b"first");
    }

    /// A write into a directory that is gone says where, and leaves nothing behind.
    #[test]
    fn a_write_that_fails_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let e = write_durably(&gone, "abc123", b"sb1").unwrap_err();
        assert!(e.to_string().contains("gone/abc123"), "{e}");
        assert!(names(dir.path()).is_empty());
    }
}
