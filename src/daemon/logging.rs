//! Structured logs on stderr (tracing): text for people, JSON for shippers.

use std::io::IsTerminal;

use super::LogFormat;

/// Installs the global subscriber. `level` wins over RUST_LOG; the default
/// is `info`.
pub fn init(level: Option<&str>, format: LogFormat) {
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::new(l),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init: a second daemon in the same process (tests) keeps the first.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
}
