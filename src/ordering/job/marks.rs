//! The marks of the containers crisp terminated (DESIGN.md §5.1): one file per container under
//! `<state_dir>/terminated/`, written durably, loaded and pruned at start.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use parking_lot::RwLock;

/// The containers crisp terminated, by sandbox, persisted one file per container id whose
/// content is its sandbox id (`<state_dir>/terminated/<container_id>`).
///
/// A mark is written like kubelet writes its checkpoints: to a temporary file that is fsynced,
/// renamed over the mark, and the directory fsynced, so a mark that was reported to kubelet
/// (the sidecar is stopped right after) survives a power loss. Removal is not fsynced: a mark
/// that comes back after a crash names a container the runtime no longer has, and
/// [`crate::ordering::Engine::prune_marks`] drops it at the next start.
pub struct Terminated {
    dir: Option<PathBuf>,
    marks: RwLock<Marks>,
    /// Mirror of "some mark exists", read on the hot path (`interest`) without locking.
    any: AtomicBool,
    /// The marks found on disk at open: the only ones the prune at start may drop (a mark made
    /// since is for a container that existed when it was made).
    loaded: parking_lot::Mutex<Vec<String>>,
}

#[derive(Default)]
struct Marks {
    /// Container id → its sandbox id; empty for a mark written before crisp kept the sandbox,
    /// until the prune at start learns it from the runtime.
    sandbox_of: HashMap<String, String>,
    /// Sandbox id → how many of its containers are marked.
    by_sandbox: HashMap<String, usize>,
    /// Marks whose sandbox is not known (yet): any sandbox may be theirs.
    unknown: usize,
}

impl Marks {
    fn insert(&mut self, id: &str, sandbox: &str) {
        self.remove(id);
        if sandbox.is_empty() {
            self.unknown += 1;
        } else {
            *self.by_sandbox.entry(sandbox.to_string()).or_default() += 1;
        }
        self.sandbox_of.insert(id.to_string(), sandbox.to_string());
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some(sandbox) = self.sandbox_of.remove(id) else {
            return false;
        };
        if sandbox.is_empty() {
            self.unknown -= 1;
        } else if let Some(n) = self.by_sandbox.get_mut(&sandbox) {
            *n -= 1;
            if *n == 0 {
                self.by_sandbox.remove(&sandbox);
            }
        }
        true
    }
}

pub(crate) use crate::ordering::durable::{write_durably, WriteError as MarkError, TMP_SUFFIX};

/// The file [`Terminated::check_writable`] writes: not a container id, never loaded.
const WRITABLE_PROBE: &str = ".writable";
/// A mark file holds a sandbox id: read no more than this of it.
const MAX_MARK_FILE: u64 = 256;

impl Terminated {
    /// Loads the set from `state_dir` (created if missing). A `None` dir keeps it in memory only.
    pub fn open(state_dir: Option<PathBuf>) -> Self {
        let dir = state_dir.map(|state_dir| state_dir.join("terminated"));
        let mut marks = Marks::default();
        let mut loaded = Vec::new();
        if let Some(dir) = &dir {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "cannot create the state directory; job-mode exit codes will not survive a crisp restart"
                );
            }
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    if name.ends_with(TMP_SUFFIX) {
                        let _ = std::fs::remove_file(entry.path());
                        continue;
                    }
                    if is_container_id(&name) {
                        let sandbox = read_sandbox(&entry.path());
                        marks.insert(&name, &sandbox);
                        loaded.push(name);
                    }
                }
            }
        }
        Terminated {
            dir,
            any: AtomicBool::new(!marks.sandbox_of.is_empty()),
            marks: RwLock::new(marks),
            loaded: parking_lot::Mutex::new(loaded),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.any.load(Relaxed)
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        !self.is_empty() && self.marks.read().sandbox_of.contains_key(id)
    }

    /// Whether a container of `sandbox` may be marked (a mark whose sandbox is not known yet
    /// may be of any).
    pub(crate) fn may_have_sandbox(&self, sandbox: &str) -> bool {
        if self.is_empty() {
            return false;
        }
        let marks = self.marks.read();
        marks.unknown > 0 || marks.by_sandbox.contains_key(sandbox)
    }

    /// Marks container `id` of `sandbox`: at once in memory, then durably on disk (off the async
    /// workers) before this returns. A mark that could not be written durably is taken back
    /// out of memory and the error returned: the caller must not act on it (job mode does not
    /// stop a sidecar whose mark a restart would lose, issue #43 item 5).
    pub(crate) async fn insert(&self, id: &str, sandbox: &str) -> Result<(), MarkError> {
        if !is_container_id(id) || !is_container_id(sandbox) {
            return Ok(());
        }
        {
            let mut marks = self.marks.write();
            marks.insert(id, sandbox);
            self.any.store(true, Relaxed);
        }
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        let (name, content) = (id.to_string(), sandbox.to_string());
        let written =
            tokio::task::spawn_blocking(move || write_durably(&dir, &name, content.as_bytes()))
                .await
                .unwrap_or_else(|e| {
                    Err(MarkError::Write {
                        path: PathBuf::from(id),
                        source: std::io::Error::other(e.to_string()),
                    })
                });
        if written.is_err() {
            let mut marks = self.marks.write();
            marks.remove(id);
            self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
        }
        written
    }

    /// Whether a mark can be written now: one durable write of a probe file (not a container
    /// id, so never loaded as a mark), removed again. Job mode asks before it runs a sidecar's
    /// preStop hook, so a state directory that refuses marks stops nothing (issue #43 item 5).
    pub(crate) async fn check_writable(&self) -> Result<(), MarkError> {
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || {
            let written = write_durably(&dir, WRITABLE_PROBE, b"");
            let _ = std::fs::remove_file(dir.join(WRITABLE_PROBE));
            written
        })
        .await
        .unwrap_or_else(|e| {
            Err(MarkError::Write {
                path: PathBuf::from(WRITABLE_PROBE),
                source: std::io::Error::other(e.to_string()),
            })
        })
    }

    pub(crate) fn remove(&self, id: &str) {
        if self.is_empty() {
            return;
        }
        let removed = {
            let mut marks = self.marks.write();
            let removed = marks.remove(id);
            self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
            removed
        };
        // Outside the lock: relay threads read the marks (`contains`) and must not wait for a
        // file system.
        if removed {
            self.unlink(id);
        }
    }

    /// Drops the marks of `sandbox`'s containers (RemovePodSandbox removes them with it).
    pub(crate) fn remove_sandbox(&self, sandbox: &str) {
        if self.is_empty() {
            return;
        }
        let ids: Vec<String> = {
            let mut marks = self.marks.write();
            if !marks.by_sandbox.contains_key(sandbox) {
                return;
            }
            let ids: Vec<String> = marks
                .sandbox_of
                .iter()
                .filter(|(_, s)| s.as_str() == sandbox)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                marks.remove(id);
            }
            self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
            ids
        };
        // Outside the lock, as in `remove`.
        for id in ids {
            self.unlink(&id);
        }
    }

    fn unlink(&self, id: &str) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join(id));
        }
    }

    /// Whether marks found at open still wait for [`Terminated::prune`].
    pub(crate) fn prune_pending(&self) -> bool {
        !self.loaded.lock().is_empty()
    }

    /// Reconciles the marks found at open with the containers the runtime has now (`sandbox_of`:
    /// a container's sandbox, `None` when the runtime does not have it): drops the marks of
    /// containers it no longer has and learns the sandbox of the others. Returns how many were
    /// dropped. Blocking (file removals and rewrites): called off the async workers.
    pub(crate) fn prune(&self, sandbox_of: impl Fn(&str) -> Option<String>) -> usize {
        let loaded = std::mem::take(&mut *self.loaded.lock());
        let mut pruned = 0;
        for id in loaded {
            let known = self.marks.read().sandbox_of.get(&id).cloned();
            let Some(known) = known else {
                continue; // removed since (RemoveContainer)
            };
            match sandbox_of(&id) {
                None => {
                    let removed = {
                        let mut marks = self.marks.write();
                        let removed = marks.remove(&id);
                        self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
                        removed
                    };
                    if removed {
                        self.unlink(&id);
                        pruned += 1;
                    }
                }
                Some(sandbox) if known.is_empty() && is_container_id(&sandbox) => {
                    self.marks.write().insert(&id, &sandbox);
                    if let Some(dir) = &self.dir {
                        if let Err(e) = write_durably(dir, &id, sandbox.as_bytes()) {
                            tracing::warn!(
                                container_id = %id,
                                error = %e,
                                "cannot persist the terminated-sidecar mark"
                            );
                        }
                    }
                }
                Some(_) => {}
            }
        }
        pruned
    }
}

/// The sandbox id a mark file holds; empty for an empty (older) or unreadable one.
fn read_sandbox(path: &Path) -> String {
    use std::io::Read;
    let mut content = String::new();
    let read =
        std::fs::File::open(path).and_then(|f| f.take(MAX_MARK_FILE).read_to_string(&mut content));
    match read {
        Ok(_) if is_container_id(content.trim()) => content.trim().to_string(),
        _ => String::new(),
    }
}

/// Container ids are hex in containerd and CRI-O; anything else is not used as a file name.
fn is_container_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
