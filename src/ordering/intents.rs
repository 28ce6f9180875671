//! Held calls as durable intents (issue #43; DESIGN.md "What crisp keeps"): a call kubelet
//! sent and crisp holds is something crisp took from kubelet, and kubelet may never send it
//! again if crisp dies holding it (a removed static pod's StopContainer under kubelet 1.26).
//! So before it holds one, crisp records the intent under `<state_dir>/intents/` — one small
//! JSON file per call, written by the state directory's one writer ([`super::durable`]) to
//! survive crisp's death ([`INTENT_DURABILITY`]) — and removes it once the call is answered. A restarted crisp
//! reconciles them with the runtime before it serves ([`super::Engine::reconcile_intents`]):
//!
//! - a **create** hold (an app's CreateContainer waiting for its sidecars) keeps its clock: the
//!   start timeout counts from kubelet's first call, not from crisp's restart;
//! - a **held stop** (a sidecar's StopContainer waiting for the apps) whose container still
//!   runs is carried out by crisp itself, in the same order (after the pod's apps exit), by
//!   the intent's own end (kubelet's deadline) and with what is left of the pod's grace;
//! - a **stop** crisp forwarded at once (an app's, in a pod with sidecars) whose answer crisp's
//!   death dropped is carried out at once with what is left of the grace: the held sidecar
//!   stops wait for those apps, and kubelet may not send either again.
//!
//! An intent is removed only once its action is done (the call answered, or the stop carried
//! out): a crash at any step leaves it on disk, and carrying it out again is a StopContainer of
//! a stopped container, a no-op in the runtime. An intent whose container no longer runs is
//! dropped without action. What a file holds is ids, a container name (a DNS-1123 label),
//! wall-clock times and a timeout — never an env value, a command or any other tenant text;
//! a file that is corrupt, oversized or names anything else is logged and skipped. At most
//! [`MAX_INTENTS`] are kept; past that a held call is held as before, without surviving a
//! restart (counted in `crisp_state_write_errors_total{what="intent"}`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::durable::{write, Durability, WriteError, TMP_SUFFIX};

/// At most this many intents are kept (a node runs at most a few hundred pods; kubelet holds
/// one call per container at a time).
pub const MAX_INTENTS: usize = 4096;
/// An intent file is a few hundred bytes: read no more than this of one.
const MAX_INTENT_FILE: u64 = 4096;
/// An intent older than this (by its wall clock) is dropped at start: no start timeout or
/// grace period crisp honours is that long.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// An intent must survive crisp's death, the promise it keeps (kubelet may not send the call
/// again), and nothing more: a power loss ends every container and sandbox an intent names
/// (kubelet starts the pods again in new sandboxes; a restarted runtime runs no old task), so
/// an intent that comes back after one, or comes back damaged, is dropped at the next start
/// like any other of a container that no longer runs. Not fsyncing keeps the durable write off
/// a held stop's path: two fsyncs cost a median of 7.3 ms before the call could be forwarded,
/// and while crisp has read a stop whose intent is not yet written, its death loses the stop
/// (RELIABILITY.md, "intents").
pub(crate) const INTENT_DURABILITY: Durability = Durability::CrispDeath;

/// What kind of call an intent keeps.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    /// An app's CreateContainer held for its sidecars: its clock.
    Create,
    /// A sidecar's StopContainer held until the pod's apps exit.
    HeldStop,
    /// A StopContainer forwarded at once (an app's, or a native sidecar's), until answered.
    Stop,
    /// A StopPodSandbox of a pod with sidecars, held while apps run or forwarded, until
    /// answered: kubelet 1.26 does not send it again for a removed static pod either.
    StopSandbox,
}

/// One kept call. Times are wall-clock milliseconds since the epoch (a restarted crisp has a
/// new monotonic clock); 0: none.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Intent {
    pub(crate) kind: Kind,
    pub(crate) sandbox_id: String,
    /// The stopped container (stops); empty for a create and a sandbox's stop.
    #[serde(default)]
    pub(crate) container_id: String,
    /// The container's name when it is a DNS-1123 label (a create's always is); else empty.
    #[serde(default)]
    pub(crate) name: String,
    /// When kubelet sent the call (a create: its first hold).
    pub(crate) sent_ms: u64,
    /// A held stop: when its hold ends (kubelet's deadline less the forwarded stop's tail).
    #[serde(default)]
    pub(crate) hold_until_ms: u64,
    /// A stop: when the pod's grace budget ends.
    #[serde(default)]
    pub(crate) budget_end_ms: u64,
    /// A stop: the timeout kubelet asked for (seconds).
    #[serde(default)]
    pub(crate) timeout: i64,
}

impl Intent {
    /// The intent's file name: `create-<sandbox>-<name>`, `stop-<container>` or
    /// `sandbox-<sandbox>` (ids and a DNS-1123 label only: nothing that could leave the
    /// directory).
    pub(crate) fn key(&self) -> String {
        match self.kind {
            Kind::Create => format!("create-{}-{}", self.sandbox_id, self.name),
            Kind::HeldStop | Kind::Stop => format!("stop-{}", self.container_id),
            Kind::StopSandbox => format!("sandbox-{}", self.sandbox_id),
        }
    }

    /// Whether every field is what crisp writes (a file from disk is not trusted).
    fn valid(&self) -> bool {
        let name_ok = self.name.is_empty() || crate::tenant::is_dns1123_label(&self.name);
        let ids_ok = match self.kind {
            Kind::Create => self.container_id.is_empty() && !self.name.is_empty(),
            Kind::HeldStop | Kind::Stop => is_id(&self.container_id),
            Kind::StopSandbox => self.container_id.is_empty() && self.name.is_empty(),
        };
        is_id(&self.sandbox_id) && name_ok && ids_ok && (0..=MAX_TIMEOUT).contains(&self.timeout)
    }
}

/// A stop's timeout as kept: bounded like the grace it came from.
const MAX_TIMEOUT: i64 = super::decide::MAX_GRACE.as_secs() as i64;

/// Runtime ids as file-name parts: what containerd and CRI-O use.
fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Why an intent was not kept durably (the call is then held as before).
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeepError {
    /// An id that is not a runtime id (only another CRI client could send one): not kept.
    #[error("not a runtime id")]
    Invalid,
    #[error("{MAX_INTENTS} intents are kept already")]
    Full,
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// The kept intents: in memory by key, each with the token of its owner (the call, or the
/// restarted crisp carrying it out), and on disk when a state directory is configured.
pub struct Intents {
    dir: Option<PathBuf>,
    kept: Arc<Mutex<HashMap<String, (Intent, u64)>>>,
    /// Where [`Intents::done`] unlinks a file: off the caller's thread (a relay thread, or an
    /// async worker), since an unlink waits on the disk. `None` outside an async runtime.
    blocking: Option<tokio::runtime::Handle>,
    /// Stops found on disk at open: carried out or dropped by the reconcile at start.
    loaded: Mutex<Vec<(String, Intent, u64)>>,
    tokens: AtomicU64,
}

impl Intents {
    /// Loads the intents under `state_dir/intents` (created if missing); `None` keeps them in
    /// memory only. A file that is not a valid intent is logged and skipped (and removed).
    pub fn open(state_dir: Option<PathBuf>) -> Self {
        let intents = Intents {
            dir: state_dir.map(|dir| dir.join("intents")),
            kept: Arc::new(Mutex::new(HashMap::new())),
            blocking: tokio::runtime::Handle::try_current().ok(),
            loaded: Mutex::new(Vec::new()),
            tokens: AtomicU64::new(1),
        };
        if let Some(dir) = &intents.dir {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "cannot create the intents directory; held calls will not survive a crisp restart"
                );
            }
            intents.load(dir);
        }
        intents
    }

    fn load(&self, dir: &std::path::Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let oldest = wall_ms().saturating_sub(MAX_AGE.as_millis() as u64);
        let mut kept = self.kept.lock();
        let mut loaded = self.loaded.lock();
        for entry in entries.flatten() {
            let file = entry.file_name();
            let name = file.to_string_lossy();
            if name.ends_with(TMP_SUFFIX) {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let intent = match read_intent(&entry.path()) {
                Ok(intent) if intent.key() == name => intent,
                Ok(_) => {
                    skip(&entry.path(), "its content names another call");
                    continue;
                }
                Err(why) => {
                    skip(&entry.path(), &why);
                    continue;
                }
            };
            if intent.sent_ms < oldest {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            if kept.len() >= MAX_INTENTS {
                skip(&entry.path(), "over the cap of kept intents");
                continue;
            }
            let token = self.token();
            if intent.kind != Kind::Create {
                loaded.push((name.to_string(), intent.clone(), token));
            }
            kept.insert(name.to_string(), (intent, token));
        }
    }

    /// A new owner token (see [`Intents::keep`]).
    pub(crate) fn token(&self) -> u64 {
        self.tokens.fetch_add(1, Relaxed)
    }

    /// Keeps `intent` for `token`'s owner: at once in memory, then durably on disk (off the
    /// async workers) before this returns. A later keep of the same call (kubelet's retry)
    /// takes the intent over: the earlier owner's [`Intents::done`] then leaves it.
    pub(crate) async fn keep(&self, intent: Intent, token: u64) -> Result<(), KeepError> {
        if !intent.valid() {
            return Err(KeepError::Invalid);
        }
        let key = intent.key();
        let content = serde_json::to_vec(&intent).unwrap_or_default();
        {
            let mut kept = self.kept.lock();
            if kept.len() >= MAX_INTENTS && !kept.contains_key(&key) {
                return Err(KeepError::Full);
            }
            kept.insert(key.clone(), (intent, token));
        }
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        let name = key.clone();
        // Written to survive crisp's death, not a power loss: see [`INTENT_DURABILITY`].
        let written =
            tokio::task::spawn_blocking(move || write(&dir, &name, &content, INTENT_DURABILITY))
                .await
                .unwrap_or_else(|e| {
                    Err(WriteError::Write {
                        path: PathBuf::from(&key),
                        source: std::io::Error::other(e.to_string()),
                    })
                });
        if written.is_err() {
            self.release(&key, token);
        }
        Ok(written?)
    }

    /// The call `token` owns is answered (or its stop carried out): its intent goes, unless a
    /// later keep took it over. The removal is not fsynced: an intent that comes back after a
    /// power loss is of a container that no longer runs, dropped at the next start.
    ///
    /// The unlink runs on a blocking thread, never on the caller's (a relay thread, an async
    /// worker): a slow or hung disk stalls no call. It checks, under the lock, that no later
    /// keep of the same call owns the key again, so it never removes a retry's file.
    pub(crate) fn done(&self, key: &str, token: u64) {
        if !self.release(key, token) {
            return;
        }
        let Some(dir) = &self.dir else {
            return;
        };
        let (kept, path, key) = (self.kept.clone(), dir.join(key), key.to_string());
        let unlink = move || {
            let kept = kept.lock();
            if !kept.contains_key(&key) {
                let _ = std::fs::remove_file(&path);
            }
        };
        match &self.blocking {
            Some(rt) => drop(rt.spawn_blocking(unlink)),
            None => unlink(),
        }
    }

    fn release(&self, key: &str, token: u64) -> bool {
        let mut kept = self.kept.lock();
        if kept.get(key).is_some_and(|(_, owner)| *owner == token) {
            kept.remove(key);
            true
        } else {
            false
        }
    }

    /// Whether `token` still owns the intent `key`.
    pub(crate) fn owns(&self, key: &str, token: u64) -> bool {
        self.kept
            .lock()
            .get(key)
            .is_some_and(|(_, owner)| *owner == token)
    }

    /// When the create hold of `name` in `sandbox` began (wall ms), if one is kept.
    pub(crate) fn create_since(&self, sandbox: &str, name: &str) -> Option<u64> {
        let key = format!("create-{sandbox}-{name}");
        self.kept.lock().get(&key).map(|(intent, _)| intent.sent_ms)
    }

    /// The create hold of `name` in `sandbox` is over (forwarded, or failed by policy).
    pub(crate) fn forget_create(&self, sandbox: &str, name: &str) {
        let key = format!("create-{sandbox}-{name}");
        let token = self.kept.lock().get(&key).map(|(_, token)| *token);
        if let Some(token) = token {
            self.done(&key, token);
        }
    }

    /// RemovePodSandbox: every intent of `sandbox` goes with it.
    pub(crate) fn forget_sandbox(&self, sandbox: &str) {
        let gone: Vec<(String, u64)> = {
            let kept = self.kept.lock();
            if kept.is_empty() {
                return;
            }
            kept.iter()
                .filter(|(_, (intent, _))| intent.sandbox_id == sandbox)
                .map(|(key, (_, token))| (key.clone(), *token))
                .collect()
        };
        for (key, token) in gone {
            self.done(&key, token);
        }
    }

    /// The stops found on disk at open, for the reconcile at start (once).
    pub(crate) fn take_loaded(&self) -> Vec<(String, Intent, u64)> {
        std::mem::take(&mut *self.loaded.lock())
    }

    /// The sandboxes with a create hold kept.
    pub(crate) fn create_sandboxes(&self) -> Vec<String> {
        let mut sandboxes: Vec<String> = self
            .kept
            .lock()
            .values()
            .filter(|(intent, _)| intent.kind == Kind::Create)
            .map(|(intent, _)| intent.sandbox_id.clone())
            .collect();
        sandboxes.sort();
        sandboxes.dedup();
        sandboxes
    }

    /// How many intents are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept.lock().len()
    }
}

fn read_intent(path: &std::path::Path) -> Result<Intent, String> {
    use std::io::Read;
    let mut content = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_INTENT_FILE + 1).read_to_end(&mut content))
        .map_err(|e| format!("cannot read it: {e}"))?;
    if content.len() as u64 > MAX_INTENT_FILE {
        return Err(format!("larger than {MAX_INTENT_FILE} bytes"));
    }
    let intent: Intent =
        serde_json::from_slice(&content).map_err(|e| format!("not an intent: {e}"))?;
    if !intent.valid() {
        return Err("a field is not what crisp writes".into());
    }
    Ok(intent)
}

/// A file in the intents directory that is not a valid intent: said, and removed (it would
/// be said again at every start).
fn skip(path: &std::path::Path, why: &str) {
    let file = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    tracing::warn!(
        file = %crate::tenant::text(&file, crate::tenant::MAX_FIELD),
        why = %crate::tenant::text(why, crate::tenant::MAX_FIELD),
        "skipping a file in the intents directory that is not a valid intent; removing it"
    );
    let _ = std::fs::remove_file(path);
}

/// The wall clock, in ms since the epoch. In unit tests it moves with tokio's (paused) clock,
/// so an engine restarted on virtual time finds its intents as old as virtual time says.
pub(crate) fn wall_ms() -> u64 {
    wall_of(super::now())
}

/// The wall-clock time (ms since the epoch) of the engine clock's `at`.
pub(crate) fn wall_of(at: Instant) -> u64 {
    let (anchor, anchor_wall) = anchor();
    let wall = if at >= anchor {
        anchor_wall.checked_add(at - anchor)
    } else {
        anchor_wall.checked_sub(anchor - at)
    };
    wall.and_then(|w| w.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64)
}

/// The engine clock's instant of the wall-clock time `ms` (past or future), clamped to a day
/// either side of now.
pub(crate) fn instant_of(ms: u64) -> Instant {
    let at = super::now();
    let now_ms = wall_of(at);
    if ms >= now_ms {
        super::decide::later(at, Duration::from_millis(ms - now_ms).min(MAX_AGE))
    } else {
        let age = Duration::from_millis(now_ms - ms).min(MAX_AGE);
        at.checked_sub(age).unwrap_or(at)
    }
}

/// Outside tests: the clocks now. In tests: a fixed pair, so the wall clock moves with
/// tokio's paused one.
#[cfg(not(test))]
fn anchor() -> (Instant, SystemTime) {
    (super::now(), SystemTime::now())
}

#[cfg(test)]
fn anchor() -> (Instant, SystemTime) {
    static ANCHOR: std::sync::OnceLock<(Instant, SystemTime)> = std::sync::OnceLock::new();
    *ANCHOR.get_or_init(|| (Instant::now(), SystemTime::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop_intent(container: &str) -> Intent {
        Intent {
            kind: Kind::HeldStop,
            sandbox_id: "sb1".into(),
            container_id: container.into(),
            name: "proxy".into(),
            sent_ms: wall_ms(),
            hold_until_ms: wall_ms() + 10_000,
            budget_end_ms: wall_ms() + 30_000,
            timeout: 30,
        }
    }

    #[tokio::test]
    async fn an_intent_survives_a_reopen_until_done() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::open(Some(dir.path().to_path_buf()));
        let token = intents.token();
        intents.keep(stop_intent("c1"), token).await.unwrap();
        let file = dir.path().join("intents/stop-c1");
        let on_disk: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(on_disk["kind"], "held_stop");
        assert_eq!(on_disk["container_id"], "c1");

        let again = Intents::open(Some(dir.path().to_path_buf()));
        let loaded = again.take_loaded();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].1, stop_intent("c1").clone_times(&loaded[0].1));
        assert!(again.take_loaded().is_empty(), "taken once");

        intents.done("stop-c1", token);
        gone(&file).await;
        assert!(!file.exists());
    }

    /// Waits (at most 5 s) for `done`'s unlink, which runs on a blocking thread.
    async fn gone(file: &std::path::Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while file.exists() && std::time::Instant::now() < deadline {
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    impl Intent {
        fn clone_times(mut self, from: &Intent) -> Intent {
            self.sent_ms = from.sent_ms;
            self.hold_until_ms = from.hold_until_ms;
            self.budget_end_ms = from.budget_end_ms;
            self
        }
    }

    /// kubelet's retry of a kept stop takes it over: the earlier owner's `done` (a replay
    /// that finished later) leaves the retry's intent in place.
    #[tokio::test]
    async fn a_later_keep_takes_the_intent_over() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::open(Some(dir.path().to_path_buf()));
        let (first, retry) = (intents.token(), intents.token());
        intents.keep(stop_intent("c1"), first).await.unwrap();
        intents.keep(stop_intent("c1"), retry).await.unwrap();
        intents.done("stop-c1", first);
        assert!(intents.owns("stop-c1", retry));
        assert!(dir.path().join("intents/stop-c1").exists());
        intents.done("stop-c1", retry);
        assert_eq!(intents.len(), 0);
    }

    /// Tenant-shaped or damaged files are logged and skipped, never loaded and never a crash:
    /// oversized, not JSON, unknown fields (an env value someone added), ids that are paths, a
    /// name that is not a label, a content that names another call.
    #[test]
    fn corrupt_oversized_or_foreign_intent_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("intents");
        std::fs::create_dir_all(&d).unwrap();
        let good = serde_json::to_vec(&Intent {
            kind: Kind::Stop,
            sandbox_id: "sb1".into(),
            container_id: "c2".into(),
            name: String::new(),
            sent_ms: wall_ms(),
            hold_until_ms: 0,
            budget_end_ms: 0,
            timeout: 10,
        })
        .unwrap();
        std::fs::write(d.join("stop-c2"), &good).unwrap();
        std::fs::write(d.join("stop-c3"), vec![b' '; 10_000]).unwrap();
        std::fs::write(d.join("stop-c4"), b"{\"kind\":").unwrap();
        std::fs::write(
            d.join("stop-c5"),
            br#"{"kind":"stop","sandbox_id":"sb1","container_id":"c5","sent_ms":1,"env":"SECRET=1"}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("stop-.."),
            br#"{"kind":"stop","sandbox_id":"sb1","container_id":"..","sent_ms":1}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("create-sb1-Not_A_Label"),
            br#"{"kind":"create","sandbox_id":"sb1","name":"Not_A_Label","sent_ms":1}"#,
        )
        .unwrap();
        // A sandbox's stop names a sandbox and nothing else.
        std::fs::write(
            d.join("sandbox-sb1"),
            br#"{"kind":"stop_sandbox","sandbox_id":"sb1","container_id":"c9","sent_ms":1}"#,
        )
        .unwrap();
        std::fs::write(
            d.join("sandbox-.."),
            br#"{"kind":"stop_sandbox","sandbox_id":"..","sent_ms":1}"#,
        )
        .unwrap();
        std::fs::write(d.join("stop-c6"), &good).unwrap();
        std::fs::write(d.join("stop-c7.tmp"), b"half").unwrap();
        let intents = Intents::open(Some(dir.path().to_path_buf()));
        let loaded: Vec<String> = intents.take_loaded().into_iter().map(|l| l.0).collect();
        assert_eq!(loaded, vec!["stop-c2".to_string()]);
        let mut left: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec!["stop-c2".to_string()]);
    }

    /// The cap holds: past it a keep is refused (the call is held as before), and nothing is
    /// written.
    #[tokio::test]
    async fn the_number_of_intents_is_capped() {
        let intents = Intents::open(None);
        for n in 0..MAX_INTENTS {
            intents
                .keep(stop_intent(&format!("c{n}")), intents.token())
                .await
                .unwrap();
        }
        let over = intents.keep(stop_intent("one-more"), intents.token()).await;
        assert!(matches!(over, Err(KeepError::Full)), "{over:?}");
        // Kubelet's retry of a kept call still takes it over.
        intents
            .keep(stop_intent("c0"), intents.token())
            .await
            .unwrap();
        assert_eq!(intents.len(), MAX_INTENTS);
    }

    /// A write the state directory refuses is reported and leaves nothing kept.
    #[tokio::test]
    async fn a_refused_write_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::open(Some(dir.path().to_path_buf()));
        std::fs::remove_dir(dir.path().join("intents")).unwrap();
        let e = intents
            .keep(stop_intent("c1"), intents.token())
            .await
            .unwrap_err();
        assert!(matches!(e, KeepError::Write(_)), "{e}");
        assert_eq!(intents.len(), 0);
    }

    /// What keeping an intent costs the held call (the `keep` it awaits before forwarding or
    /// holding), as crisp does it (written and renamed, [`INTENT_DURABILITY`]) and with the two
    /// fsyncs of a power-loss write, interleaved in one run on the same disk. A measurement,
    /// not a bound (disks differ): run by hand, with `CRISP_INTENT_BENCH_DIR` on the disk that
    /// holds crisp's `state_dir` (default: the system's temporary directory).
    /// `cargo test --release --lib intents::tests::cost -- --ignored --nocapture`
    #[ignore = "a measurement: prints the cost of keeping an intent, asserts nothing of a disk"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cost_of_keeping_an_intent_with_and_without_fsync() {
        const ROUNDS: usize = 300;
        let base = std::env::var_os("CRISP_INTENT_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let (a, b) = (
            tempfile::tempdir_in(&base).unwrap(),
            tempfile::tempdir_in(&base).unwrap(),
        );
        let crisp = Intents::open(Some(a.path().to_path_buf()));
        let synced = b.path().to_path_buf();
        let content = serde_json::to_vec(&stop_intent("c0")).unwrap();
        let (mut kept, mut fsynced) = (Vec::new(), Vec::new());
        for n in 0..ROUNDS {
            let t = std::time::Instant::now();
            let token = crisp.token();
            crisp
                .keep(stop_intent(&format!("c{n}")), token)
                .await
                .unwrap();
            kept.push(t.elapsed());
            crisp.done(&format!("stop-c{n}"), token);
            let (dir, content) = (synced.clone(), content.clone());
            let t = std::time::Instant::now();
            tokio::task::spawn_blocking(move || {
                write(&dir, &format!("stop-c{n}"), &content, Durability::PowerLoss)
            })
            .await
            .unwrap()
            .unwrap();
            fsynced.push(t.elapsed());
        }
        let show = |name: &str, v: &mut Vec<Duration>| {
            v.sort();
            let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3;
            println!(
                "{name}: median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} keeps)",
                at(0.5),
                at(0.9),
                at(0.99),
                at(1.0),
                v.len()
            );
        };
        println!("on {} (load {})", base.display(), {
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
                .to_string()
        });
        show("kept as crisp keeps it (no fsync)", &mut kept);
        show("with the two fsyncs of a power-loss write", &mut fsynced);
    }

    #[test]
    fn wall_clock_times_map_back_to_the_engine_clock() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let t0 = super::super::now();
            let ms = wall_of(t0);
            tokio::time::sleep(Duration::from_secs(100)).await;
            let back = instant_of(ms);
            let off = if back > t0 { back - t0 } else { t0 - back };
            assert!(off < Duration::from_millis(2), "{off:?}");
            let ahead = instant_of(wall_ms() + 5_000);
            assert!(ahead > super::super::now() + Duration::from_millis(4_990));
        });
    }
}
