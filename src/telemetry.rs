//! Logging setup: tracing-subscriber with an env-filter, text or JSON lines on stderr, written
//! by a thread of their own.
//!
//! No thread that must not block writes to stderr itself: a relay thread, the watchdog's
//! supervisor and the async runtime's workers hand each line to a bounded queue
//! (tracing-appender's non-blocking writer, lossy), and the `crisp-log` thread writes it. A
//! stalled journald (or a full pipe) fills the queue; further lines are dropped and counted
//! (`crisp_log_lines_dropped_total`), and crisp goes on serving: a restart could not fix a
//! stalled log sink, and one the watchdog caused by blocking on it would loop.

use std::sync::OnceLock;

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

/// Installs the global subscriber. `RUST_LOG`, when set, overrides the configured level.
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
}
