//! The persistent-drive side of the command line: `create --persist`
//! flags, waiting for a restore with a progress bar, `ramd sync` with a
//! progress bar, `ramd restore`, and what `delete` says about the data.

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::{print_json, CliError};
use crate::api::client::Client;
use crate::api::wire::drives::{Deleted, DriveInfo};
use crate::api::wire::persistence::RestoreRequest;
use crate::size::format_size;

/// `ramd create` flags for persistent drives.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PersistArgs {
    /// Keep the drive in the daemon's state directory (restored at every
    /// start; restored now when it is there already).
    #[arg(long)]
    pub persist: bool,
    /// none | periodic | flush [default: periodic].
    #[arg(long, value_name = "MODE", requires = "persist")]
    pub durability: Option<String>,
    /// Time between background syncs, e.g. 60s, 10m, 500ms [default: 60s].
    #[arg(long, value_name = "DURATION", requires = "persist")]
    pub sync_interval: Option<String>,
    /// Encrypt the saved data (AES-256-GCM) with the key in --key-file.
    #[arg(long, requires_all = ["persist", "key_file"])]
    pub encrypt: bool,
    /// The key: 32 raw bytes or 64 hex digits. A new one: (umask 077;
    /// set -C; head -c 32 /dev/urandom > F). The daemon reads it at every
    /// start; it is never logged, and never written by ramd.
    #[arg(long, value_name = "FILE", requires = "encrypt")]
    pub key_file: Option<PathBuf>,
    /// Return at once when the drive is restoring instead of waiting with
    /// a progress bar.
    #[arg(long, requires = "persist")]
    pub no_wait: bool,
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{msg:24} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .expect("a valid template")
    .progress_chars("=> ")
}

/// Polls the drive until it is no longer restoring, with a progress bar
/// on stderr (hidden when stderr is not a terminal).
fn poll_restore(client: &Client, mut d: DriveInfo) -> Result<DriveInfo, CliError> {
    let bar = ProgressBar::new(0).with_style(bar_style());
    while d.state == "restoring" {
        if let Some(r) = d.persist.as_ref().and_then(|p| p.restore.as_ref()) {
            bar.set_length(r.total_bytes);
            bar.set_position(r.done_bytes);
            bar.set_message(format!("restoring: {}", r.phase.replace('_', " ")));
        }
        std::thread::sleep(Duration::from_millis(100));
        d = client.drive(&d.name)?;
    }
    bar.finish_and_clear();
    Ok(d)
}

/// Says how a restore ended; a failed drive is an error (exit 1).
fn restore_outcome(d: &DriveInfo, json: bool) -> Result<(), CliError> {
    if json {
        print_json(d)?;
    }
    match d.state.as_str() {
        "failed" => Err(CliError::RestoreFailed {
            name: d.name.clone(),
            reason: d.error.as_deref().unwrap_or("unknown error").to_owned(),
        }),
        _ => {
            if !json {
                let summary = d
                    .persist
                    .as_ref()
                    .and_then(|p| p.restore.as_ref())
                    .and_then(|r| r.summary.clone())
                    .unwrap_or_default();
                println!("{} is {}: {summary}", d.name, d.state);
                println!("at {}", d.uri);
            }
            Ok(())
        }
    }
}

/// After `ramd create --persist`: a new drive, or a restore to wait for.
pub fn after_create(
    client: &Client,
    d: DriveInfo,
    json: bool,
    no_wait: bool,
) -> Result<(), CliError> {
    let p = d.persist.as_ref().expect("a persistent drive");
    match d.state.as_str() {
        "restoring" => {
            if !json {
                eprintln!(
                    "{} already holds drive '{}': restoring it (its data is kept; delete it first to start empty)",
                    p.state_dir, d.name
                );
                // Which stored settings it keeps (drive.json).
                if let Some(n) = &d.notice {
                    eprintln!("{n}");
                }
            }
            if no_wait {
                return if json {
                    print_json(&d)
                } else {
                    println!("restoring {} (follow with `ramd info {}`)", d.name, d.name);
                    Ok(())
                };
            }
            let notice = d.notice.clone();
            let mut d = poll_restore(client, d)?;
            d.notice = d.notice.or(notice);
            restore_outcome(&d, json)
        }
        "failed" => restore_outcome(&d, json),
        _ => {
            if json {
                return print_json(&d);
            }
            println!(
                "created {} ({}{}, persistent: {}{}, sync every {}) at {}",
                d.name,
                format_size(d.size_bytes),
                match &d.compression {
                    Some(c) => format!(", compressed {}", c.algorithm),
                    None => String::new(),
                },
                p.durability,
                if p.encrypted { ", encrypted" } else { "" },
                super::output::interval(p.sync_interval_ms),
                d.uri
            );
            println!("state directory: {}", p.state_dir);
            Ok(())
        }
    }
}

/// `ramd restore`: asks for the restore, then waits for it.
pub fn restore(
    client: &Client,
    name: &str,
    req: &RestoreRequest,
    json: bool,
    no_wait: bool,
) -> Result<(), CliError> {
    let d = client.restore_drive(name, req)?;
    wait_restore(client, d, json, no_wait)
}

/// Waits for the restore `d` reports (started by `ramd restore`).
pub fn wait_restore(
    client: &Client,
    d: DriveInfo,
    json: bool,
    no_wait: bool,
) -> Result<(), CliError> {
    if no_wait {
        if json {
            return print_json(&d);
        }
        println!("restoring {} (follow with `ramd info {}`)", d.name, d.name);
        return Ok(());
    }
    let d = poll_restore(client, d)?;
    restore_outcome(&d, json)
}

/// What `ramd delete` says about a persistent drive's data.
pub fn after_delete(r: &Deleted) {
    match (&r.state_dir, r.data_kept) {
        (Some(dir), Some(true)) => println!(
            "saved {}'s data in {dir}; `ramd create {} --persist` restores it",
            r.name, r.name
        ),
        (Some(dir), Some(false)) => eprintln!(
            "warning: {}'s saved data in {dir} was removed (use --keep-data to keep it)",
            r.name
        ),
        _ => {}
    }
}

/// `ramd sync NAME`: the sync runs in one request while this thread shows
/// its progress from another.
pub fn sync(watcher: &Client, name: &str, json: bool) -> Result<(), CliError> {
    let target = watcher.target().clone();
    let result = std::thread::scope(|s| {
        let worker = s.spawn(|| Client::to(target).sync_drive(name));
        let bar = ProgressBar::new(0).with_style(bar_style());
        bar.set_message(format!("syncing {name}"));
        while !worker.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(d) = watcher.drive(name) {
                if let Some(p) = d
                    .persist
                    .and_then(|p| p.status)
                    .and_then(|s| s.sync_progress)
                {
                    bar.set_length(p.total_bytes);
                    bar.set_position(p.done_bytes);
                }
            }
        }
        bar.finish_and_clear();
        worker.join().expect("the sync thread does not panic")
    })?;
    if json {
        return print_json(&result);
    }
    let secs = result.duration_ms / 1000.0;
    if result.generation == 0 {
        println!("{name}: nothing changed since the last sync; it is durable");
    } else {
        let bytes = result.data_bytes + result.zero_bytes;
        println!(
            "synced {name}: {} changed ({} written to the journal) in {secs:.3}s ({}/s); durable as generation {}",
            format_size(bytes),
            format_size(result.journal_bytes),
            format_size((result.journal_bytes as f64 / secs.max(1e-6)) as u64),
            result.generation
        );
    }
    Ok(())
}
