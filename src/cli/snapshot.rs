//! `ramd snapshot create|list|delete|prune|status` and `ramd restore
//! DRIVE --from REMOTE`: snapshots of drives and caches in object storage
//! (thin client of /v1/snapshots; a name that is no drive's is tried as a
//! cache's). Pushes and restores run in the daemon as jobs; the
//! command follows its job with a progress bar (drive bytes done, bytes
//! sent or received) and prints how it ended. Ctrl-C stops waiting, not
//! the job.

use std::time::Duration;

use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

use super::output::{interval, render, table};
use super::{arg_name, print_json, CliError, JsonFlag};
use crate::api::client::Client;
use crate::api::wire::snapshots::{CreateSnapshot, Job, PruneRequest, RestoreSnapshot};
use crate::size::format_size;

/// `ramd snapshot ...`
#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Push a point-in-time snapshot of a drive (or a cache) to a remote;
    /// it keeps serving (writes made meanwhile are not in the snapshot).
    ///
    /// Examples:
    ///   ramd snapshot create db --to s3
    ///   ramd snapshot create db --to s3 --label "before upgrade" --encrypt
    ///   ramd snapshot create dbcache --to s3     # a cache: written back first
    ///
    /// Only chunks the remote lacks are sent (incremental, deduplicated,
    /// compressed). A push cut short leaves earlier snapshots intact and the
    /// next one resumes. A cache's snapshot is its logical image (the
    /// backing with its dirty data written back, read through the cache);
    /// it restores as a drive.
    #[command(verbatim_doc_comment)]
    Create {
        #[arg(value_parser = arg_name)]
        drive: String,
        /// The remote (`ramd remote list`).
        #[arg(long, value_name = "REMOTE")]
        to: String,
        /// Free text kept with the snapshot.
        #[arg(long)]
        label: Option<String>,
        /// Encrypt with the remote's encrypt_key_file.
        #[arg(long)]
        encrypt: bool,
        /// Return at once with the job id instead of waiting.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// List snapshots, oldest first (every remote unless --remote).
    List {
        /// Only this drive's.
        #[arg(value_parser = arg_name)]
        drive: Option<String>,
        #[arg(long, value_name = "REMOTE")]
        remote: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Delete one snapshot (its chunks are freed by the next prune).
    Delete {
        #[arg(value_parser = arg_name)]
        drive: String,
        /// The id as `snapshot list` prints it (DRIVE/MS-SUFFIX or MS-SUFFIX).
        id: String,
        #[arg(long, value_name = "REMOTE")]
        remote: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Apply retention per drive, then delete the chunks no kept snapshot
    /// needs. Without --keep-* every snapshot is kept (only unreferenced
    /// chunks older than the grace period go).
    Prune {
        #[arg(long, value_name = "REMOTE")]
        remote: String,
        /// Keep the N newest snapshots of each drive.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        keep_last: Option<u64>,
        /// Keep the newest snapshot of each of the N most recent days.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        keep_daily: Option<u64>,
        /// Unreferenced chunks younger than this stay (a running push may
        /// need them) [default: 2h].
        #[arg(long, value_name = "DURATION", value_parser = parse_grace)]
        grace: Option<Duration>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// A drive's (or cache's) pushes: schedule, last snapshot, last
    /// error, totals.
    Status {
        #[arg(value_parser = arg_name)]
        drive: String,
        #[command(flatten)]
        out: JsonFlag,
    },
}

fn parse_grace(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

/// A snapshot job that did not succeed.
#[derive(Debug, thiserror::Error)]
#[error("snapshot {kind} of drive '{drive}' failed: {message}")]
pub struct JobFailed {
    pub kind: String,
    pub drive: String,
    pub message: String,
}

pub fn run(client: &Client, cmd: SnapshotCommand) -> Result<(), CliError> {
    match cmd {
        SnapshotCommand::Create {
            drive,
            to,
            label,
            encrypt,
            no_wait,
            out,
        } => {
            let req = CreateSnapshot {
                remote: to,
                label,
                encrypt,
            };
            let job = match client.create_snapshot(&drive, &req) {
                // Not a drive: a cache of that name, if there is one.
                Err(e) if e.code() == Some("drive_not_found") => {
                    match client.create_cache_snapshot(&drive, &req) {
                        Err(c) if c.code() == Some("cache_not_found") => return Err(e.into()),
                        r => r?,
                    }
                }
                r => r?,
            };
            finish(client, job, no_wait, out.json)
        }
        SnapshotCommand::List { drive, remote, out } => {
            list(client, drive.as_deref(), remote.as_deref(), out.json)
        }
        SnapshotCommand::Delete {
            drive,
            id,
            remote,
            out,
        } => {
            let r = client.delete_snapshot(&remote, &drive, &id)?;
            if out.json {
                return print_json(&r);
            }
            println!(
                "snapshot {} deleted from '{}' (its chunks go at the next prune)",
                r.id, r.remote
            );
            Ok(())
        }
        SnapshotCommand::Prune {
            remote,
            keep_last,
            keep_daily,
            grace,
            out,
        } => {
            let req = PruneRequest {
                remote,
                keep_last,
                keep_daily,
                grace_ms: grace.map(|g| g.as_millis() as u64),
            };
            let r = client.prune_snapshots(&req)?;
            if out.json {
                return print_json(&r);
            }
            println!(
                "remote '{}': {} snapshot(s) kept, {} deleted; {} chunk(s) deleted ({}), {} kept for being young",
                r.remote,
                r.snapshots_kept,
                r.snapshots_deleted,
                r.chunks_deleted,
                format_size(r.bytes_freed),
                r.chunks_young
            );
            Ok(())
        }
        SnapshotCommand::Status { drive, out } => status(client, &drive, out.json),
    }
}

fn list(
    client: &Client,
    drive: Option<&str>,
    remote: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let l = client.list_snapshots(drive, remote)?;
    if json {
        return print_json(&l);
    }
    let mut t = table(&["REMOTE", "DRIVE", "ID", "CREATED", "LABEL"], &[]);
    for s in &l.snapshots {
        let when = std::time::UNIX_EPOCH + Duration::from_millis(s.created_unix_ms);
        t.add_row(vec![
            s.remote.clone(),
            s.drive.clone(),
            s.id.clone(),
            humantime::format_rfc3339_seconds(when).to_string(),
            s.label.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    print!("{}", render(&t));
    for f in &l.failed {
        eprintln!(
            "warning: remote '{}' could not be listed: {}",
            f.remote, f.message
        );
    }
    Ok(())
}

fn status(client: &Client, drive: &str, json: bool) -> Result<(), CliError> {
    let s = match client.snapshot_status(drive) {
        Err(e) if e.code() == Some("drive_not_found") => {
            match client.cache_snapshot_status(drive) {
                Err(c) if c.code() == Some("cache_not_found") => return Err(e.into()),
                r => r?,
            }
        }
        r => r?,
    };
    if json {
        return print_json(&s);
    }
    if let Some(r) = &s.restore_from {
        println!("restore_from: {r}");
    }
    if s.statuses.is_empty() {
        println!("'{drive}' has no snapshot pushes yet (ramd snapshot create {drive} --to REMOTE)");
    }
    for st in &s.statuses {
        let every = st.interval_ms.map_or("on request".to_owned(), |ms| {
            format!("every {}", interval(ms))
        });
        println!(
            "remote {} ({every}){}",
            st.remote,
            if st.running { ": pushing now" } else { "" }
        );
        println!(
            "  last snapshot: {}{}",
            st.last_snapshot.as_deref().unwrap_or("-"),
            labelled(st.last_label.as_deref())
        );
        if let Some(e) = &st.last_error {
            println!("  last error:    {e}");
        }
        println!(
            "  pushes: {} ({} failed), {} uploaded in all",
            st.pushes_total,
            st.failures_total,
            format_size(st.bytes_uploaded_total)
        );
    }
    Ok(())
}

/// `ramd restore DRIVE --from REMOTE [--snapshot ID] [--as NAME]
/// [--persist ...]`.
pub fn restore_from(
    client: &Client,
    req: &RestoreSnapshot,
    no_wait: bool,
    json: bool,
) -> Result<(), CliError> {
    let job = client.restore_snapshot(req)?;
    finish(client, job, no_wait, json)
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{msg:24} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .expect("a valid template")
    .progress_chars("=> ")
}

/// Follows a job to its end (unless `no_wait`), then prints it.
fn finish(client: &Client, mut job: Job, no_wait: bool, json: bool) -> Result<(), CliError> {
    if !no_wait {
        let bar = ProgressBar::new(0).with_style(bar_style());
        let verb = if job.kind == "push" {
            "pushing"
        } else {
            "restoring"
        };
        bar.set_message(format!("{verb} {}", job.drive));
        while job.state == "running" {
            bar.set_length(job.progress.bytes_total);
            bar.set_position(job.progress.bytes_done);
            std::thread::sleep(Duration::from_millis(200));
            job = client.snapshot_job(job.id)?;
        }
        bar.finish_and_clear();
    }
    if json {
        print_json(&job)?;
    } else {
        print_job(&job);
    }
    if job.state == "failed" {
        return Err(JobFailed {
            kind: job.kind,
            drive: job.drive,
            message: job.error.unwrap_or_default(),
        }
        .into());
    }
    Ok(())
}

/// ` ("LABEL")` after a snapshot's id, nothing for none.
fn labelled(label: Option<&str>) -> String {
    label.map_or_else(String::new, |l| format!(" ({l:?})"))
}

fn print_job(job: &Job) {
    if let Some(p) = &job.push {
        // The ratio is data per plaintext byte sent: 1.0x on a first push
        // of data without repeated chunks (nothing to save), higher as
        // chunks repeat or are on the remote already; so its parts are
        // named, not only the ratio.
        let ratio = p.dedup_ratio.map_or("nothing new to send".to_owned(), |r| {
            format!("{r:.1}x less than the data")
        });
        println!(
            "snapshot {}{} pushed to '{}': {} of data, {} uploaded, {ratio} ({} chunk(s) sent, {} on the remote already, {} repeated in this drive, {} zero)",
            p.snapshot,
            labelled(p.label.as_deref()),
            job.remote,
            format_size(p.bytes_data),
            format_size(p.bytes_uploaded),
            p.chunks_uploaded,
            p.chunks_skipped,
            p.chunks_deduped,
            p.chunks_zero
        );
    } else if let Some(r) = &job.restore {
        println!(
            "drive '{}' restored from snapshot {}{} on '{}': {} written, {} downloaded; serving it{}",
            r.drive,
            r.snapshot,
            labelled(r.label.as_deref()),
            job.remote,
            format_size(r.bytes_written),
            format_size(r.bytes_downloaded),
            if r.persistent {
                " (persistent: its state directory was durable before it was served)"
            } else {
                ""
            }
        );
    } else if job.state == "running" {
        println!(
            "job {} started ({} of drive '{}'); follow it with `ramd snapshot status {}`",
            job.id, job.kind, job.drive, job.drive
        );
    }
}
