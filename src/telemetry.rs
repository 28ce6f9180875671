//! Logging setup: tracing-subscriber with an env-filter, text or JSON lines on stderr, written
//! by a thread of their own.
//!
//! No thread that must not block writes to stderr itself: a relay thread, the watchdog's
//! supervisor and the async runtime's workers hand each line to a bounded queue
//! (tracing-appender's non-blocking writer, lossy), and the `crisp-log` thread writes it. A
//! stalled journald (or a full pipe) fills the queue; further lines are dropped and counted
//! (`crisp_log_lines_dropped_total`), and crisp goes on serving: a restart could not fix a
//! stalled log sink, and one the watchdog caused by blocking on it would loop.
//!
//! Panics take the same way out. Rust's default panic hook writes the message to stderr
//! itself, synchronously, from the panicking thread — a relay thread, a tokio worker — so a
//! stalled journald would stall that thread before its panic is even caught. [`init`] installs
//! a hook that counts the panic (`crisp_panics_total`) and logs it at ERROR through the queue:
//! thread name, location and payload, the payload cut to [`PANIC_PAYLOAD_MAX`] bytes and
//! escaped to one line (a panic message can carry tenant text: an annotation, a container
//! name), plus the backtrace when `RUST_BACKTRACE` asks for one.

use std::panic::PanicHookInfo;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Once, OnceLock};

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Lines the queue holds before it drops (about 2 MiB of typical lines).
pub const QUEUED_LINES: usize = 8192;

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines dropped so far because the writer's queue was full.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Bytes of a panic's payload logged, before escaping; the rest is cut (and said so).
pub const PANIC_PAYLOAD_MAX: usize = 512;
/// Bytes of a backtrace logged (with `RUST_BACKTRACE` set).
const PANIC_BACKTRACE_MAX: usize = 16 * 1024;

static PANICS: AtomicU64 = AtomicU64::new(0);
static PANIC_HOOK: Once = Once::new();

/// Panics so far, on any thread, caught or not (`crisp_panics_total`).
pub fn panics() -> u64 {
    PANICS.load(Relaxed)
}

/// Installs the panic hook (once per process; later calls do nothing): every panic is counted
/// and logged through the subscriber of the panicking thread, never written to stderr by that
/// thread. Until a subscriber is installed, panics go to the hook that was there before.
pub fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Relaxed);
            // No subscriber for this thread: none installed yet (the default hook then says
            // it, as it always did), or a panic inside the subscriber itself (tracing hands a
            // re-entered thread no subscriber): counted only, as writing stderr could block.
            let routed =
                tracing::dispatcher::get_default(|d| !d.is::<tracing::subscriber::NoSubscriber>());
            if routed {
                log_panic(info);
            } else if !tracing::dispatcher::has_been_set() {
                previous(info);
            }
        }));
    });
}

/// One ERROR line for a panic: thread, location, payload (cut, escaped), backtrace if asked.
fn log_panic(info: &PanicHookInfo<'_>) {
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("<unnamed>");
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_default();
    // `panic!("{x}")` carries a String, `panic!("text")` a &str (`payload_as_str` is 1.91).
    let payload = info.payload();
    let payload = match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => bounded_escaped(s, PANIC_PAYLOAD_MAX),
        (_, Some(s)) => bounded_escaped(s, PANIC_PAYLOAD_MAX),
        _ => "(not a string)".to_string(),
    };
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        tracing::error!(
            target: "crisp::panic",
            thread = %bounded_escaped(thread, 64),
            location = %location,
            payload = %payload,
            backtrace = %bounded_escaped(&backtrace.to_string(), PANIC_BACKTRACE_MAX),
            "crisp panicked (a bug: please report it with this line)"
        );
    } else {
        tracing::error!(
            target: "crisp::panic",
            thread = %bounded_escaped(thread, 64),
            location = %location,
            payload = %payload,
            "crisp panicked (a bug: please report it with this line)"
        );
    }
}

/// `text`'s first `max` bytes (at a character boundary) on one line: control characters,
/// quotes and backslashes escaped as Rust escapes them, so a payload can neither forge a log
/// line nor send a terminal escape; ` [cut N bytes]` when it was longer.
fn bounded_escaped(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out: String = text[..end].escape_debug().collect();
    if end < text.len() {
        out.push_str(&format!(" [cut {} bytes]", text.len() - end));
    }
    out
}

/// Keeps the log writer thread; dropped at exit, it writes what is still queued (waiting at
/// most a second).
#[must_use = "logs queued when this drops may be lost"]
pub struct Logging(#[allow(dead_code)] Option<WorkerGuard>);

/// A writer that queues at most `lines` lines for `out`, written by the `crisp-log` thread,
/// and drops (and counts) what does not fit.
fn queued<W: std::io::Write + Send + 'static>(
    out: W,
    lines: usize,
) -> (tracing_appender::non_blocking::NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(lines)
        .thread_name("crisp-log")
        .finish(out)
}

/// Installs the global subscriber and the panic hook ([`install_panic_hook`]). `RUST_LOG`,
/// when set, overrides the configured level.
pub fn init(level: &str, format: LogFormat) -> Logging {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| {
            // Validated at config load; fall back to info rather than panic.
            EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"))
        });
    use std::io::IsTerminal;
    let (writer, guard) = queued(std::io::stderr(), QUEUED_LINES);
    let _ = DROPPED.set(writer.error_counter());
    // Colours only on a terminal: journald and log files get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    install_panic_hook();
    Logging(Some(guard))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A log sink that takes nothing until released: a stalled journald.
    struct Stalled(mpsc::Receiver<()>);

    impl Write for Stalled {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Fails on bde328c, whose log lines were written to stderr by the thread that logged
    /// them: a stalled sink held that thread (a relay thread, the watchdog) in write(2).
    #[test]
    fn a_stalled_log_sink_drops_and_counts_lines_and_never_blocks_the_logger() {
        let (release, rx) = mpsc::channel();
        let (mut writer, guard) = super::queued(Stalled(rx), 16);
        let (done_tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..1000 {
                let _ = writer.write_all(format!("line {i}\n").as_bytes());
            }
            done_tx
                .send(writer.error_counter().dropped_lines())
                .unwrap();
        });
        let dropped = done
            .recv_timeout(Duration::from_secs(10))
            .expect("the logging thread was blocked by the stalled sink");
        // The sink holds one line, the queue 16: the rest is dropped.
        assert!((980..=1000).contains(&dropped), "{dropped}");
        drop(release);
        drop(guard);
    }

    /// A log sink that keeps what it is given.
    #[derive(Clone, Default)]
    struct Kept(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Kept {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Panics `n` times on a thread named `name` whose subscriber writes to `writer`, each
    /// caught as the relay catches its own; resolves once the thread is done.
    fn panic_on_a_thread(
        name: &str,
        writer: tracing_appender::non_blocking::NonBlocking,
        n: usize,
        payload: String,
    ) -> mpsc::Receiver<()> {
        super::install_panic_hook();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .finish();
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                tracing::subscriber::with_default(subscriber, || {
                    for _ in 0..n {
                        let p = payload.clone();
                        let _ = std::panic::catch_unwind(move || panic!("{p}"));
                    }
                });
                let _ = done_tx.send(());
            })
            .unwrap();
        done
    }

    /// Fails without the hook (4288bb5): Rust's default hook wrote the panic to stderr from
    /// the panicking thread, and nothing reached the log writer.
    #[test]
    fn a_panic_is_logged_through_the_log_writer_on_one_line_cut_and_escaped() {
        let kept = Kept::default();
        let (writer, guard) = super::queued(kept.clone(), 64);
        let before = super::panics();
        let payload = format!("pod ns/x\n\x1b[31mforged line{}", "y".repeat(2000));
        panic_on_a_thread("relay-7", writer, 1, payload)
            .recv_timeout(Duration::from_secs(10))
            .expect("the panicking thread never finished");
        drop(guard);
        let text = String::from_utf8(kept.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("crisp panicked"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line = lines[0];
        assert!(
            line.contains("ERROR") && line.contains("thread=relay-7"),
            "{line}"
        );
        assert!(line.contains("src/telemetry.rs:"), "{line}");
        assert!(line.contains(r"pod ns/x\n\u{1b}[31mforged line"), "{line}");
        assert!(!line.contains('\x1b'), "{line}");
        let cut = 2000 + "pod ns/x\n\x1b[31mforged line".len() - super::PANIC_PAYLOAD_MAX;
        assert!(line.contains(&format!("[cut {cut} bytes]")), "{line}");
        assert!(super::panics() > before);
    }

    /// Fails without the hook (4288bb5): the panics reach neither the writer nor the count.
    #[test]
    fn a_panic_on_a_thread_whose_log_sink_is_stalled_returns_at_once() {
        let (release, rx) = mpsc::channel();
        let (writer, guard) = super::queued(Stalled(rx), 16);
        let dropped = writer.error_counter();
        let before = super::panics();
        panic_on_a_thread("relay-8", writer, 200, "stalled".into())
            .recv_timeout(Duration::from_secs(10))
            .expect("the panicking thread was blocked by the stalled log sink");
        assert!(super::panics() - before >= 200);
        // The sink holds one line, the queue 16: the rest of the 200 panics' lines dropped.
        assert!(
            dropped.dropped_lines() >= 180,
            "{}",
            dropped.dropped_lines()
        );
        drop(release);
        drop(guard);
    }
}
