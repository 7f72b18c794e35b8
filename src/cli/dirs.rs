//! `ramd dir add|list|info|sync|remove`: directories kept in RAM, through
//! the daemon's `/v1/dirs` API.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::output::interval as format_interval;
use super::{output, print_json, CliError, JsonFlag};
use crate::api::client::Client;
use crate::api::wire::dirs::{AddDir, IntervalValue, PatchDir};
use crate::api::wire::dirs::{
    DirInfo, DirOrigin, DirStatus, MountMode, StopOutcome, SyncReport, UsageLevel,
};
use crate::api::wire::values::SizeValue;
use crate::size::format_size;

/// Where `ramd install-units` puts the ordering drop-in.
const INSTALLED_DROP_IN: &str = "/etc/systemd/system/ramd.service.d/dirs.conf";

#[derive(Subcommand, Debug)]
pub enum DirCommand {
    /// Keep a directory in RAM, synced back to disk crash-safely.
    ///
    /// Its content is copied into a tmpfs mounted over it (or an overlay
    /// with --overlay), and synced back to disk every interval, on
    /// `ramd dir sync`, before suspend and when the daemon stops.
    ///
    /// Examples:
    ///   ramd dir add ~/.cache --interval 30m --size-limit 2G
    ///   ramd dir add /var/log --overlay
    ///
    /// Returns once PATH shows the RAM copy. See docs/dirs.md.
    #[command(verbatim_doc_comment)]
    Add {
        /// The directory (must exist; not a mount point, not on tmpfs).
        path: PathBuf,
        /// Time between syncs to disk: 30s, 10m, 1h [default: 10m].
        #[arg(long, value_name = "DURATION")]
        interval: Option<String>,
        /// overlayfs instead of a full copy: instant, RAM holds only what
        /// is written from now on, unchanged files are read from disk.
        #[arg(long)]
        overlay: bool,
        /// Most RAM the copy may use; writes past it fail with ENOSPC
        /// (warnings at 80% and 95%) [default: half of RAM].
        #[arg(long, value_name = "SIZE")]
        size_limit: Option<String>,
        /// Dated copies of unsynced RAM content kept after a crash [default: 3].
        #[arg(long, value_name = "N")]
        recovery_generations: Option<u32>,
        /// Add even though other processes have files, their working
        /// directory or mappings there (refused otherwise, naming them).
        /// What they write to the disk copy meanwhile is kept and reported
        /// as conflicts. System trees and /tmp, /home, /root... stay refused.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// List directories in RAM: usage, state, last sync, recovery copies.
    List {
        #[command(flatten)]
        out: JsonFlag,
    },

    /// One directory in detail (by path or id).
    Info {
        /// The directory's path or id.
        dir: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Change a directory's interval, size limit or recovery copies.
    ///
    /// The tmpfs is resized at once (not below what it holds); the next
    /// sync is one new interval from now at the latest.
    ///
    /// Example: ramd dir set ~/.cache --size-limit 4G --interval 1h
    #[command(verbatim_doc_comment)]
    Set {
        /// The directory's path or id.
        dir: String,
        /// Time between syncs to disk: 30s, 10m, 1h.
        #[arg(long, value_name = "DURATION")]
        interval: Option<String>,
        /// Most RAM the copy may use, or "none" (half of RAM).
        #[arg(long, value_name = "SIZE")]
        size_limit: Option<String>,
        /// Dated copies of unsynced RAM content kept after a crash.
        #[arg(long, value_name = "N")]
        recovery_generations: Option<u32>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Sync to disk now; returns when the on-disk copy is durable.
    ///
    /// Prints what was copied, deleted and left for the next sync because
    /// it kept changing.
    Sync {
        /// The directory's path or id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        dir: Option<String>,
        /// Every directory (what the sleep hook runs before suspend).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Stop keeping a directory in RAM (final sync, unmount).
    ///
    /// PATH is a normal directory again, with the latest content.
    ///
    /// Refused while a program has a file open for writing there (the
    /// error names it) unless --force.
    Remove {
        /// The directory's path or id.
        dir: String,
        /// Programs keep writing there: freeze PATH (no new writes), sync,
        /// detach (new opens go to the disk copy) and keep the RAM copy
        /// until they close it; what they write after the final sync is
        /// then saved as a recovery copy. Nothing is lost.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
}

/// Runs `f` (a call that waits for the daemon to copy or sync a tree)
/// with a spinner and the elapsed time on stderr when it is a terminal.
fn waiting<T>(what: String, quiet: bool, f: impl FnOnce() -> T) -> T {
    if quiet || !std::io::stderr().is_terminal() {
        return f();
    }
    let bar = indicatif::ProgressBar::new_spinner().with_message(what);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .expect("a valid template"),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let out = f();
    bar.finish_and_clear();
    out
}

/// A path argument as the daemon knows it (absolute, symlinks resolved),
/// or an id as given.
fn key(arg: &str) -> Result<String, CliError> {
    let p = Path::new(arg);
    let looks_like_path = arg.contains('/') || arg.starts_with('.') || p.exists();
    if !looks_like_path {
        return Ok(arg.to_owned());
    }
    let abs = std::fs::canonicalize(p)
        .or_else(|_| std::path::absolute(p))
        .map_err(|source| CliError::Path {
            path: PathBuf::from(arg),
            source,
        })?;
    Ok(abs.display().to_string())
}

/// Runs `ramd dir ...`.
pub fn run(client: &Client, cmd: DirCommand) -> Result<(), CliError> {
    match cmd {
        DirCommand::Add {
            path,
            interval,
            overlay,
            size_limit,
            recovery_generations,
            force,
            out,
        } => {
            let req = AddDir {
                path: String::new(),
                interval: interval.map(IntervalValue::Text),
                overlay,
                size_limit: size_limit.map(SizeValue::Text),
                recovery_generations,
                force,
            };
            add(client, &path, req, out.json)
        }
        DirCommand::List { out } => {
            let list = client.list_dirs()?;
            if out.json {
                return print_json(&list);
            }
            print!("{}", list_table(&list.dirs));
            Ok(())
        }
        DirCommand::Set {
            dir,
            interval,
            size_limit,
            recovery_generations,
            out,
        } => set(
            client,
            &dir,
            interval,
            size_limit,
            recovery_generations,
            out.json,
        ),
        DirCommand::Info { dir, out } => {
            let info = client.dir(&key(&dir)?)?;
            if out.json {
                return print_json(&info);
            }
            print!("{}", info_table(&info));
            Ok(())
        }
        DirCommand::Sync { all: true, out, .. } => sync_all(client, out.json),
        DirCommand::Sync { dir, out, .. } => {
            let dir = dir.expect("clap requires a directory without --all");
            let k = key(&dir)?;
            let r = waiting(format!("syncing {k}"), out.json, || client.sync_dir(&k))?;
            if out.json {
                return print_json(&r);
            }
            print_sync(&r.path, &r.report);
            Ok(())
        }
        DirCommand::Remove { dir, force, out } => remove(client, &dir, force, out.json),
    }
}

/// `ramd dir add`: resolves PATH (saying so when it differs) and asks
/// the daemon to keep it in RAM.
fn add(client: &Client, path: &std::path::Path, req: AddDir, json: bool) -> Result<(), CliError> {
    let abs = std::fs::canonicalize(path).map_err(|source| CliError::NoDir {
        path: path.to_path_buf(),
        source,
    })?;
    let given = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if abs != given && !json {
        eprintln!(
            "note: {} resolves to {}; keeping that in RAM",
            given.display(),
            abs.display()
        );
    }
    let req = AddDir {
        path: abs.display().to_string(),
        ..req
    };
    let info = waiting(format!("copying {} into RAM", abs.display()), json, || {
        client.add_dir(&req)
    })?;
    if json {
        return print_json(&info);
    }
    println!(
        "{} is in RAM ({}, {}), synced to disk every {}, on `ramd dir sync`, before suspend and when ramd stops",
        info.path.display(),
        mode_name(info.mode),
        info.size_limit_bytes
            .map(|l| format!("limit {}", format_size(l)))
            .unwrap_or_else(|| "no size limit: up to half of RAM".into()),
        format_interval(info.sync_interval_ms)
    );
    hint_units(&info.path);
    Ok(())
}

/// `ramd dir set`: changes a directory's interval, size limit or
/// recovery generations.
fn set(
    client: &Client,
    dir: &str,
    interval: Option<String>,
    size_limit: Option<String>,
    recovery_generations: Option<u32>,
    json: bool,
) -> Result<(), CliError> {
    if interval.is_none() && size_limit.is_none() && recovery_generations.is_none() {
        return Err(CliError::NothingToChange);
    }
    let r = client.patch_dir(
        &key(dir)?,
        &PatchDir {
            interval: interval.map(IntervalValue::Text),
            size_limit: size_limit.map(SizeValue::Text),
            recovery_generations,
        },
    )?;
    if json {
        return print_json(&r);
    }
    if let Some(n) = &r.notice {
        eprintln!("note: {n}");
    }
    let i = &r.info;
    println!(
        "{}: {}, synced every {}",
        i.path.display(),
        i.size_limit_bytes
            .map(|l| format!("limit {}", format_size(l)))
            .unwrap_or_else(|| "no size limit (half of RAM)".into()),
        format_interval(i.sync_interval_ms),
    );
    Ok(())
}

/// `ramd dir sync --all`: one line per directory; fails when any failed.
fn sync_all(client: &Client, json: bool) -> Result<(), CliError> {
    let r = waiting("syncing every directory".into(), json, || {
        client.sync_all_dirs()
    })?;
    if json {
        print_json(&r)?;
    }
    let mut failed = 0;
    for x in &r.results {
        match (&x.report, &x.error) {
            (Some(rep), _) if !json => print_sync(&x.path, rep),
            (_, Some(e)) => {
                failed += 1;
                eprintln!("ramd: {}: sync failed: {}", x.path, e.message);
            }
            _ => {}
        }
    }
    if r.results.is_empty() && !json {
        println!("no directories in RAM");
    }
    if failed > 0 {
        return Err(CliError::DirsFailedToSync {
            failed,
            total: r.results.len(),
        });
    }
    Ok(())
}

/// `ramd dir remove`: the final sync, then what became of the directory
/// and of programs that still use the RAM copy.
fn remove(client: &Client, dir: &str, force: bool, json: bool) -> Result<(), CliError> {
    let k = key(dir)?;
    let r = waiting(format!("final sync of {k}"), json, || {
        client.remove_dir(&k, force)
    })?;
    if json {
        return print_json(&r);
    }
    if let Some(n) = &r.notice {
        eprintln!("note: {n}");
    }
    match &r.result {
        StopOutcome::Released {
            report,
            lazy_unmount,
            still_open,
            kept_until_closed,
        } => {
            println!(
                "{} is a normal directory again (final sync: {})",
                r.path,
                sync_summary(report)
            );
            print_conflicts(&r.path, report);
            if let Some(kept) = kept_until_closed {
                println!("note: these programs still have files in the RAM copy; it stays at {} until they close them, and what they write after the final sync is then saved as a recovery copy under the state directory (the log names it):", kept.display());
                for h in still_open {
                    println!("  {h}");
                }
            } else if *lazy_unmount {
                println!("note: programs that still had files open there keep the (synced) RAM copy until they close them");
            }
        }
        StopOutcome::HandedOver { .. } | StopOutcome::Inactive => {
            println!("{} is no longer managed by ramd", r.path);
        }
    }
    Ok(())
}

fn mode_name(m: MountMode) -> &'static str {
    match m {
        MountMode::Tmpfs => "tmpfs",
        MountMode::Overlay => "overlay",
    }
}

/// `3 files copied (1.2 MiB), 1 deleted, 40 unchanged, 0.12 s`.
pub fn sync_summary(r: &SyncReport) -> String {
    let mut parts = vec![format!(
        "{} file{} copied ({})",
        r.files_copied,
        if r.files_copied == 1 { "" } else { "s" },
        format_size(r.bytes_copied)
    )];
    let made = r.dirs_created + r.links_made + r.specials_made;
    if made > 0 {
        parts.push(format!("{made} other entries made"));
    }
    if r.entries_deleted > 0 {
        parts.push(format!("{} deleted", r.entries_deleted));
    }
    parts.push(format!("{} unchanged", r.unchanged));
    if !r.changed_during_sync.is_empty() {
        parts.push(format!(
            "{} skipped (changing)",
            r.changed_during_sync.len()
        ));
    }
    if !r.conflicts.is_empty() {
        parts.push(format!("{} kept on disk (conflict)", r.conflicts.len()));
    }
    parts.push(format!("{:.2} s", r.duration_ms as f64 / 1000.0));
    parts.join(", ")
}

fn print_sync(path: &str, r: &SyncReport) {
    println!("synced {path}: {}", sync_summary(r));
    if !r.changed_during_sync.is_empty() {
        eprintln!(
            "warning: {} file(s) kept changing during the sync; their previous version stays on disk until the next sync:",
            r.changed_during_sync.len()
        );
        for f in r.changed_during_sync.iter().take(20) {
            eprintln!("  {}", Path::new(path).join(f).display());
        }
    }
    print_conflicts(path, r);
    if r.xattrs_dropped > 0 {
        eprintln!(
            "note: the disk's filesystem refused {} extended attribute(s)",
            r.xattrs_dropped
        );
    }
}

/// Entries written to the on-disk copy behind the RAM copy (kept there).
fn print_conflicts(path: &str, r: &SyncReport) {
    if r.conflicts.is_empty() {
        return;
    }
    eprintln!(
        "warning: {} entr{} written to the on-disk copy behind the RAM copy of {path} (by programs that had it open before it went into RAM): kept on disk, not in RAM (a file RAM also has under a .ramd-conflict- name); they show up at {path} after `ramd dir remove` (see docs/dirs.md):",
        r.conflicts.len(),
        if r.conflicts.len() == 1 { "y" } else { "ies" }
    );
    for f in r.conflicts.iter().take(20) {
        eprintln!("  {}", Path::new(path).join(f).display());
    }
}

/// `12s ago`, `5m ago`, `3h ago`, `2d ago`.
fn ago(unix_ms: Option<u64>) -> String {
    let Some(t) = unix_ms else {
        return "never".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let s = now.saturating_sub(t) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

fn level_name(l: UsageLevel) -> &'static str {
    match l {
        UsageLevel::Ok => "ok",
        UsageLevel::Warning => "warning",
        UsageLevel::Critical => "critical",
        UsageLevel::Full => "full",
    }
}

/// `active`, `active, 85% WARNING`, `failed`.
fn state(d: &DirInfo) -> String {
    match d.status {
        DirStatus::Active => match d.usage_level {
            Some(l) if l != UsageLevel::Ok => format!("{} (!)", level_name(l)),
            _ => "active".into(),
        },
        DirStatus::Activating => "activating".into(),
        DirStatus::Failed => "failed".into(),
    }
}

/// What the user should act on, one line each.
fn warnings(d: &DirInfo) -> Vec<String> {
    let p = d.path.display();
    let mut out = Vec::new();
    if let (Some(u), Some(l)) = (d.usage, d.usage_level) {
        let what = format!(
            "RAM copy {}% full ({} of {})",
            u.used_bytes.saturating_mul(100) / u.total_bytes.max(1),
            format_size(u.used_bytes),
            format_size(u.total_bytes)
        );
        match l {
            UsageLevel::Ok => {}
            UsageLevel::Warning => out.push(format!("{p}: warning: {what}")),
            UsageLevel::Critical => out.push(format!(
                "{p}: critical: {what}; raise its size limit (ramd dir set PATH --size-limit SIZE) or delete files"
            )),
            UsageLevel::Full => out.push(format!(
                "{p}: full: {what}; writes fail with 'No space left on device'"
            )),
        }
    }
    if let Some(e) = &d.last_error {
        if d.status == DirStatus::Failed {
            out.push(format!("{p}: failed: {e}"));
        } else {
            out.push(format!("{p}: last sync failed: {e}"));
        }
    }
    if let Some(c) = d.recovery_copies.last() {
        out.push(format!(
            "{p}: {} recovery cop{} of unsynced RAM content after a crash; newest: {}",
            d.recovery_copies.len(),
            if d.recovery_copies.len() == 1 {
                "y"
            } else {
                "ies"
            },
            c.path.display()
        ));
    }
    if let Some(r) = d.last_sync.as_ref().filter(|r| !r.conflicts.is_empty()) {
        out.push(format!(
            "{p}: {} entr{} written to the on-disk copy behind the RAM copy kept there (`ramd dir sync {p}` lists them)",
            r.conflicts.len(),
            if r.conflicts.len() == 1 { "y" } else { "ies" }
        ));
    }
    for n in &d.notes {
        out.push(format!("{p}: {n}"));
    }
    out
}

/// `ramd dir list`.
pub fn list_table(dirs: &[DirInfo]) -> String {
    if dirs.is_empty() {
        return "no directories in RAM (keep one there with: ramd dir add PATH)\n".into();
    }
    let mut t = output::table(
        &[
            "PATH",
            "MODE",
            "USED",
            "LIMIT",
            "USE%",
            "STATE",
            "LAST SYNC",
            "EVERY",
            "RECOVERY",
        ],
        &[2, 3, 4],
    );
    for d in dirs {
        t.add_row(vec![
            d.path.display().to_string(),
            mode_name(d.mode).into(),
            d.usage
                .map(|u| format_size(u.used_bytes))
                .unwrap_or_else(|| "-".into()),
            d.usage
                .map(|u| format_size(u.total_bytes))
                .unwrap_or_else(|| "-".into()),
            d.usage_percent
                .map(|p| format!("{p}%"))
                .unwrap_or_else(|| "-".into()),
            state(d),
            ago(d.last_sync_unix_ms),
            format_interval(d.sync_interval_ms),
            match d.recovery_copies.len() {
                0 => "-".into(),
                1 => "1 copy".into(),
                n => format!("{n} copies"),
            },
        ]);
    }
    let mut s = output::render(&t);
    for d in dirs {
        for w in warnings(d) {
            s.push_str(&w);
            s.push('\n');
        }
    }
    s
}

/// Directories under `ramd stats` (empty when there are none).
pub fn stats_section(client: &Client) -> String {
    let Ok(list) = client.list_dirs() else {
        return String::new();
    };
    if list.dirs.is_empty() {
        return String::new();
    }
    let mut t = output::table(
        &[
            "DIRECTORY",
            "RAM USED",
            "USE%",
            "LAST SYNC",
            "TOOK",
            "SYNCS",
            "FAILED",
            "WRITTEN",
        ],
        &[1, 2, 4, 5, 6, 7],
    );
    for d in &list.dirs {
        t.add_row(vec![
            d.path.display().to_string(),
            d.usage
                .map(|u| {
                    format!(
                        "{} / {}",
                        format_size(u.used_bytes),
                        format_size(u.total_bytes)
                    )
                })
                .unwrap_or_else(|| "-".into()),
            d.usage_percent
                .map(|p| format!("{p}%"))
                .unwrap_or_else(|| "-".into()),
            ago(d.last_sync_unix_ms),
            d.last_sync
                .as_ref()
                .map(|r| format!("{:.2}s", r.duration_ms as f64 / 1000.0))
                .unwrap_or_else(|| "-".into()),
            d.totals.syncs.to_string(),
            d.totals.failed_syncs.to_string(),
            format_size(d.totals.bytes_copied),
        ]);
    }
    format!("\n{}", output::render(&t))
}

/// `ramd dir info`.
pub fn info_table(d: &DirInfo) -> String {
    let mut t = output::table(&["FIELD", "VALUE"], &[]);
    let mut row = |k: &str, v: String| {
        t.add_row(vec![k.to_owned(), v]);
    };
    row("path", d.path.display().to_string());
    row("id", d.id.clone());
    row("mode", mode_name(d.mode).into());
    row("state", state(d));
    row(
        "size limit",
        d.size_limit_bytes
            .map(format_size)
            .unwrap_or_else(|| "none (tmpfs default: half of RAM)".into()),
    );
    if let Some(u) = d.usage {
        row(
            "RAM used",
            format!(
                "{} of {} ({}%), {} of {} inodes",
                format_size(u.used_bytes),
                format_size(u.total_bytes),
                d.usage_percent.unwrap_or(0),
                u.used_inodes,
                u.total_inodes
            ),
        );
    }
    row("sync every", format_interval(d.sync_interval_ms));
    row("last sync", ago(d.last_sync_unix_ms));
    if let Some(r) = &d.last_sync {
        row("last sync did", sync_summary(r));
    }
    row(
        "syncs",
        format!(
            "{} ok, {} failed, {} copied in total",
            d.totals.syncs,
            d.totals.failed_syncs,
            format_size(d.totals.bytes_copied)
        ),
    );
    row(
        "origin",
        match &d.origin {
            DirOrigin::Api => "api (ramd dir add)".into(),
            DirOrigin::Config { file } => {
                format!("config {}", file.display())
            }
        },
    );
    for c in &d.recovery_copies {
        row("recovery copy", c.path.display().to_string());
    }
    let mut s = output::render(&t);
    for w in warnings(d) {
        s.push_str(&w);
        s.push('\n');
    }
    s
}

/// After an add: if the systemd units are installed but their ordering
/// drop-in does not know this directory, say how to refresh it.
fn hint_units(path: &Path) {
    let Ok(text) = std::fs::read_to_string(INSTALLED_DROP_IN) else {
        return;
    };
    let unit = format!("{}.mount", super::units::escape_path(path));
    if !text.contains(&unit) {
        println!(
            "note: run `ramd install-units` again so that systemd orders {unit} after ramd's final sync at shutdown"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let r = SyncReport {
            files_copied: 1,
            bytes_copied: 2048,
            entries_deleted: 2,
            unchanged: 5,
            changed_during_sync: vec!["a".into()],
            duration_ms: 1500,
            ..SyncReport::default()
        };
        assert_eq!(
            sync_summary(&r),
            "1 file copied (2 KiB), 2 deleted, 5 unchanged, 1 skipped (changing), 1.50 s"
        );
        assert_eq!(ago(None), "never");
        let with_conflicts = SyncReport {
            conflicts: vec!["a".into(), "b.ramd-conflict-1".into()],
            ..SyncReport::default()
        };
        assert!(sync_summary(&with_conflicts).contains("2 kept on disk (conflict)"));
    }
}
