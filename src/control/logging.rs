//! Structured logs on stderr (tracing): text for people, JSON for shippers.

use std::io::IsTerminal;

use super::LogFormat;

/// Installs the global subscriber. `level` wins over RUST_LOG; the default
/// is `info`.
pub fn init(level: Option<&str>, format: LogFormat) {
    let spec = match level {
        Some(l) => l.to_owned(),
        None => std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
    };
    // fuser's own mount layer logs an unmount it retries after ours (which
    // already happened) as an error; ramd reports mounts itself.
    let filter = tracing_subscriber::EnvFilter::new(format!("{spec},fuser=warn,fuser::mnt=off"));
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
