//! Logging setup: tracing-subscriber with an env-filter, text or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `RUST_LOG`, when set, overrides the configured level.
pub fn init(level: &str, format: LogFormat) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| {
            // Validated at config load; fall back to info rather than panic.
            EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"))
        });
    use std::io::IsTerminal;
    // Colours only on a terminal: journald and log files get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
}
