//! `ramd daemon`: the one file of the command line that names the server
//! side (`crate::control`).
//!
//! Invariant: every other file of `cli` talks to the daemon only through
//! `api::client` and `api::wire` (scripts/arch_check.py enforces it), so
//! the client commands are a thin layer over the REST API and a change in
//! the daemon's internals cannot reach them except through here. What
//! passes through, and why it is the daemon's own and not a copy:
//! - [`DaemonArgs`] and [`run`]: `ramd daemon` runs the server in this
//!   process (the binary is both daemon and client).
//! - [`check_name`], [`check_drive_size`], [`check_mem_limit`],
//!   [`check_network`], [`check_identity`]: the rules the daemon applies
//!   to names, sizes, limits and access rules, checked on the command
//!   line before any request so a bad value is a usage error (exit 2) with
//!   the daemon's own message.
//! - [`config_dirs`]: `ramd install-units` orders after the directories
//!   the config file declares, read with the daemon's config parser.

use std::path::{Path, PathBuf};

pub use crate::control::drives::spec::SpecError;
pub use crate::control::{DaemonArgs, DaemonError};

/// The config file the daemon reads when none is given and it exists.
pub const DEFAULT_CONFIG_PATH: &str = crate::control::config::DEFAULT_CONFIG_PATH;

/// Runs the daemon in the foreground until SIGTERM/SIGINT (with
/// `--supervise`, under a supervisor: `control::run`).
pub fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    let result = crate::control::run::run(args);
    // The last lines (its "stopped", a shutdown error) reach stderr before
    // the process ends, when stderr takes them at all.
    crate::control::logging::flush(std::time::Duration::from_secs(1));
    result
}

/// The naming rule of drives and caches.
pub fn check_name(text: &str) -> Result<(), SpecError> {
    crate::control::drives::spec::check_name(text)
}

/// A drive size: a size of at least one page (4 KiB).
pub fn check_drive_size(text: &str) -> Result<(), SpecError> {
    crate::control::drives::spec::parse_drive_size(text).map(drop)
}

/// A memory limit: a size of at least 1 byte.
pub fn check_mem_limit(text: &str) -> Result<(), SpecError> {
    crate::control::drives::spec::parse_mem_limit(text).map(drop)
}

/// A network of an access rule: a CIDR or `unix`.
pub fn check_network(text: &str) -> Result<(), SpecError> {
    crate::control::drives::spec::parse_networks(&[text.to_owned()]).map(drop)
}

/// An identity of an access rule: not empty.
pub fn check_identity(text: &str) -> Result<(), SpecError> {
    crate::control::drives::spec::parse_access(&[text.to_owned()], &[], &[]).map(drop)
}

/// The directories (`[[dir]]`) the config file `file` declares.
pub fn config_dirs(file: &Path) -> Result<Vec<PathBuf>, DaemonError> {
    let config = crate::control::config::load(file).map_err(DaemonError::from)?;
    Ok(config.dirs.into_iter().map(|d| d.path).collect())
}
