//! `ramd upgrade [--binary PATH]`: hands every drive, ublk device and
//! client of a supervised daemon (`ramd daemon --supervise`) to another
//! ramd binary, then waits until the new serving process answers and
//! says which one serves: the new binary, or (if it failed before it
//! served) the old one again, with the reason. Nothing is lost either way
//! (docs/restart.md).

use std::time::{Duration, Instant};

use super::{print_json, CliError};
use crate::api::client::Client;
use crate::api::wire::health::{Health, UpgradeRequest};

/// How long the new serving process may take to answer.
const WAIT: Duration = Duration::from_secs(120);

/// Why an upgrade did not end with the new binary serving.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeFailed {
    #[error("no serving process answered within {}s after the upgrade started; see the daemon's log", WAIT.as_secs())]
    Timeout,
    /// The serving process was restarted for another reason than the
    /// upgrade (it ended otherwise while it stopped): the old binary runs.
    #[error("the serving process was restarted ({reason}), not upgraded: the previous binary serves; see the daemon's log, then try again")]
    NotUpgraded { reason: String },
    /// The supervisor's reason, which names the binary and its exit.
    #[error("{reason} (nothing was lost; see the daemon's log for why it failed)")]
    RolledBack { reason: String },
}

pub fn run(client: &Client, binary: Option<String>, json: bool) -> Result<(), CliError> {
    let accepted = client.upgrade(&UpgradeRequest { binary })?;
    if !json {
        eprintln!(
            "upgrading: pid {} ({}) hands over to {} ({}) ...",
            accepted.pid, accepted.version, accepted.binary, accepted.new_version
        );
    }
    let h = wait_new_pid(client, accepted.pid)?;
    let reason = h
        .supervisor
        .as_ref()
        .and_then(|s| s.last_restart_reason.clone())
        .unwrap_or_default();
    if json {
        print_json(&h)?;
    }
    if reason.contains("failed before serving") {
        return Err(UpgradeFailed::RolledBack { reason }.into());
    }
    if !reason.starts_with("upgrade to ") {
        // The old process ended otherwise (a crash while stopping): the
        // supervisor started the old binary again.
        return Err(UpgradeFailed::NotUpgraded { reason }.into());
    }
    if !json {
        println!("upgraded: pid {} serves, ramd {}", h.pid, h.version);
    }
    Ok(())
}

/// Health once a serving process other than `old` answers.
fn wait_new_pid(client: &Client, old: u32) -> Result<Health, CliError> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(h) = client.health() {
            if h.pid != old {
                return Ok(h);
            }
        }
        if Instant::now() > deadline {
            return Err(UpgradeFailed::Timeout.into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
