//! Human output: aligned tables with human sizes, rates and latencies
//! (pure formatting; the commands decide what to print).

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};

use crate::api::wire::drives::{DriveAccess, DriveInfo, NvmeHost};
use crate::api::wire::health::Health;
use crate::api::wire::persistence::PersistInfo;
use crate::api::wire::snapshots::SnapshotStatus;
use crate::api::wire::stats::{DriveStats, StatsReport};
use crate::api::wire::values::{Latency, StatsRates, StatsTotals};
use crate::size::format_size;

/// A sync interval as people write it (`10m`, `1h 30m`): the same
/// humantime spelling the daemon uses in its messages.
pub fn interval(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

/// A borderless table, columns aligned, numbers right-aligned.
pub fn table(header: &[&str], right: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for c in t.column_iter_mut() {
        // Two spaces between columns, none at the left edge.
        c.set_padding((0, 2));
    }
    for &i in right {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// Removes the padding comfy-table leaves at line ends.
pub fn render(t: &Table) -> String {
    let mut out = String::new();
    for line in t.to_string().lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `1.5 GiB`, or `-` for none.
pub fn size_or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), format_size)
}

/// A latency in microseconds as `850µs`, `12.3ms`, `1.20s`.
pub fn micros(us: Option<f64>) -> String {
    match us {
        None => "-".into(),
        Some(us) if us < 1000.0 => format!("{us:.0}µs"),
        Some(us) if us < 1_000_000.0 => format!("{:.1}ms", us / 1000.0),
        Some(us) => format!("{:.2}s", us / 1_000_000.0),
    }
}

/// A rate: `12.3k`, `980`, `1.20M`.
pub fn count_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Bytes per second as MiB/s with one decimal.
pub fn mib_s(bytes_per_s: f64) -> String {
    format!("{:.1}", bytes_per_s / (1 << 20) as f64)
}

/// `ramd list`.
pub fn drive_list(drives: &[DriveInfo]) -> String {
    if drives.is_empty() {
        return "no drives (create one with: ramd create NAME --size 1G)\n".into();
    }
    let mut t = table(
        &[
            "NAME", "SIZE", "USED", "LIMIT", "MODE", "CONNS", "ATTACHED", "COMPRESS", "URI",
        ],
        &[1, 2, 3, 5],
    );
    for d in drives {
        t.add_row(vec![
            d.name.clone(),
            format_size(d.size_bytes),
            format_size(d.allocated_bytes),
            size_or_dash(d.mem_limit_bytes),
            list_mode(d),
            d.connections.to_string(),
            if d.attachments.is_empty() {
                "-".into()
            } else {
                d.attachments.join(",")
            },
            compress_cell(d),
            uris_cell(&d.uri, &d.tcp_uris),
        ]);
    }
    render(&t)
}

/// The COMPRESS column: the algorithm and the ratio so far (`lz4 1.54x`),
/// `-` for a raw drive.
fn compress_cell(d: &DriveInfo) -> String {
    match &d.compression {
        None => "-".into(),
        Some(c) if c.ratio > 0.0 => format!("{} {:.2}x", c.algorithm, c.ratio),
        Some(c) => c.algorithm.clone(),
    }
}

/// A URI column: the unix socket's URI, then one line per TCP listener
/// (`nbds://` where the listeners require TLS).
pub fn uris_cell(uri: &str, tcp_uris: &[String]) -> String {
    std::iter::once(uri)
        .chain(tcp_uris.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The MODE column: rw/ro, with the durability of a persistent drive
/// (`rw/flush`), or its state when it is not ready.
fn list_mode(d: &DriveInfo) -> String {
    let rw = if d.read_only { "ro" } else { "rw" };
    match (&d.persist, d.state.as_str()) {
        (_, "restoring") => "restoring".into(),
        (_, "failed") => "FAILED".into(),
        (Some(p), _) => format!("{rw}/{}", p.durability),
        (None, _) => rw.into(),
    }
}

/// "12s ago" from a Unix time in milliseconds.
fn ago(unix_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let s = now.saturating_sub(unix_ms) as f64 / 1000.0;
    if s < 60.0 {
        format!("{s:.1}s ago")
    } else if s < 3600.0 {
        format!("{:.0}m {:.0}s ago", (s / 60.0).floor(), s % 60.0)
    } else {
        format!("{:.1}h ago", s / 3600.0)
    }
}

/// The persistence rows of `ramd info NAME`.
fn persist_rows(p: &PersistInfo, rows: &mut Vec<(String, String)>) {
    let mut row = |k: &str, v: String| rows.push((k.to_owned(), v));
    row(
        "durability",
        match p.durability.as_str() {
            "none" => "none (FLUSH is a no-op: saved only by `ramd sync` and clean shutdown)".into(),
            "periodic" => "periodic (a whole point-in-time image, at most one interval plus one sync old; FLUSH does not wait for the disk)".into(),
            "flush" => "flush (an acknowledged FLUSH/FUA means every earlier write is on disk)".into(),
            other => other.to_owned(),
        },
    );
    row(
        "sync interval",
        if p.durability == "none" {
            format!(
                "{} (no background syncs in mode none)",
                interval(p.sync_interval_ms)
            )
        } else {
            interval(p.sync_interval_ms)
        },
    );
    row("state dir", p.state_dir.clone());
    row(
        "encrypted",
        match &p.key_file {
            Some(k) => format!("yes (AES-256-GCM, key file {k})"),
            None => "no".into(),
        },
    );
    if let Some(s) = &p.status {
        row(
            "sync state",
            match &s.sync_progress {
                Some(pr) => format!(
                    "{} ({} of {})",
                    s.sync_state,
                    format_size(pr.done_bytes),
                    format_size(pr.total_bytes)
                ),
                None => s.sync_state.clone(),
            },
        );
        row(
            "last sync",
            match s.last_sync_unix_ms {
                Some(t) => format!(
                    "{} (took {}), generation {}",
                    ago(t),
                    micros(s.last_sync_duration_ms.map(|m| m * 1000.0)),
                    s.durable_generation
                ),
                None => "never".into(),
            },
        );
        if let Some(t) = s.durable_as_of_unix_ms {
            row("on disk", format!("the drive as of {}", ago(t)));
        }
        row(
            "dirty",
            format!("{} not yet on disk", format_size(s.dirty_bytes)),
        );
        row("journal", format_size(s.journal_bytes));
        row(
            "syncs",
            format!(
                "{} ok, {} failed, {} checkpoints, {} written, longest {}",
                s.syncs_ok,
                s.syncs_failed,
                s.checkpoints,
                format_size(s.bytes_written),
                micros(Some(s.max_sync_duration_ms * 1000.0))
            ),
        );
        row(
            "last error",
            match &s.last_error {
                Some(e) => format!(
                    "{e} ({}{})",
                    s.last_error_unix_ms.map(ago).unwrap_or_default(),
                    if s.consecutive_failures > 0 {
                        format!(", {} failure(s) in a row, retrying", s.consecutive_failures)
                    } else {
                        String::new()
                    }
                ),
                None => "-".into(),
            },
        );
    }
    if let Some(r) = &p.restore {
        row(
            "restore",
            match r.phase.as_str() {
                "done" => r.summary.clone().unwrap_or_else(|| "done".into()),
                "failed" => format!("failed: {}", r.error.as_deref().unwrap_or("?")),
                "waiting_for_memory" => format!(
                    "waiting for the host's memory to start again: {}",
                    r.error.as_deref().unwrap_or("?")
                ),
                phase => format!(
                    "{} {} of {}",
                    phase.replace('_', " "),
                    format_size(r.done_bytes),
                    format_size(r.total_bytes)
                ),
            },
        );
    }
}

/// The rows every export's `info` ends with (drives and caches alike):
/// who is connected or attached, where it came from, how to reach it.
pub fn export_rows(
    row: &mut dyn FnMut(&str, String),
    connections: u64,
    attachments: &[String],
    origin: &str,
    uri: &str,
    tcp_uris: &[String],
) {
    row("connections", connections.to_string());
    row(
        "attached at",
        if attachments.is_empty() {
            "-".into()
        } else {
            attachments.join(", ")
        },
    );
    row("origin", origin.to_owned());
    row("uri", uri.to_owned());
    for u in tcp_uris {
        row("tcp uri", u.clone());
    }
}

/// An export's NVMe/TCP subsystem NQN and the hosts connected to it.
pub fn nvme_rows(row: &mut dyn FnMut(&str, String), nqn: &Option<String>, hosts: &[NvmeHost]) {
    if let Some(nqn) = nqn {
        row("nvme nqn", nqn.clone());
    }
    for h in hosts {
        row(
            "nvme host",
            format!("{} ({} controller(s))", h.host_nqn, h.controllers),
        );
    }
}

/// A drive's access rules in one line: `open to every client`, or the
/// rules it has (`identities alice; read-only bob; networks 10.0.0.0/8`).
pub fn access_text(a: &DriveAccess) -> String {
    let mut parts = Vec::new();
    for (what, list) in [
        ("identities", &a.allow_identities),
        ("read-only", &a.read_only_identities),
        ("networks", &a.allow_networks),
    ] {
        if !list.is_empty() {
            parts.push(format!("{what} {}", list.join(", ")));
        }
    }
    if parts.is_empty() {
        "open to every client".into()
    } else {
        parts.join("; ")
    }
}

/// `ramd info NAME`.
pub fn drive_info(d: &DriveInfo) -> String {
    let mut t = table(&["FIELD", "VALUE"], &[]);
    let mut row = |k: &str, v: String| {
        t.add_row(vec![k.to_owned(), v]);
    };
    row("name", d.name.clone());
    row("kind", d.kind.clone());
    row("state", d.state.clone());
    row(
        "size",
        format!("{} ({} bytes)", format_size(d.size_bytes), d.size_bytes),
    );
    row(
        "memory",
        format!(
            "{} allocated{}{}",
            format_size(d.allocated_bytes),
            d.mem_limit_bytes
                .map(|l| format!(", limit {}", format_size(l)))
                .unwrap_or_default(),
            if d.lock_memory { ", locked in RAM" } else { "" }
        ),
    );
    row(
        "mode",
        if d.read_only {
            "read-only"
        } else {
            "read-write"
        }
        .into(),
    );
    row("overcommit", if d.overcommit { "yes" } else { "no" }.into());
    row("access", access_text(&d.access));
    export_rows(
        &mut row,
        d.connections,
        &d.attachments,
        &d.origin,
        &d.uri,
        &d.tcp_uris,
    );
    nvme_rows(&mut row, &d.nvme_nqn, &d.nvme_hosts);
    if let Some(e) = &d.error {
        row("error", e.clone());
        row(
            "next",
            format!(
                "ramd restore {n} --force | ramd restore {n} --discard-journal | ramd delete {n}",
                n = d.name
            ),
        );
    }
    if let Some(p) = &d.persist {
        let mut rows = Vec::new();
        persist_rows(p, &mut rows);
        for (k, v) in rows {
            row(&k, v);
        }
    }
    for s in &d.snapshots {
        row(&format!("snapshots to {}", s.remote), snapshot_text(s));
    }
    render(&t)
}

/// One remote's snapshot state of a drive, on one line.
pub fn snapshot_text(s: &SnapshotStatus) -> String {
    let last = match (&s.last_snapshot, s.last_success_unix_ms) {
        (Some(id), Some(ms)) => format!("last {id} ({})", ago_text(ms)),
        _ => "none yet".to_owned(),
    };
    let mut text = format!(
        "{last}; {} pushes, {} failed, {} uploaded",
        s.pushes_total,
        s.failures_total,
        format_size(s.bytes_uploaded_total)
    );
    if let Some(ms) = s.interval_ms {
        text += &format!(
            "; every {}",
            humantime::format_duration(std::time::Duration::from_millis(ms))
        );
    }
    if s.running {
        text += "; pushing now";
    }
    if let Some(e) = &s.last_error {
        text += &format!("; last error: {e}");
    }
    text
}

/// How long ago a unix-ms moment was, for people.
fn ago_text(unix_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let s = now.saturating_sub(unix_ms) / 1000;
    format!(
        "{} ago",
        humantime::format_duration(std::time::Duration::from_secs(s))
    )
}

/// `ramd stats`: the persistence of each persistent drive (empty when
/// there is none).
pub fn persist_stats(report: &StatsReport) -> String {
    let drives: Vec<&DriveStats> = report
        .drives
        .iter()
        .filter(|d| d.persist.is_some())
        .collect();
    if drives.is_empty() {
        return String::new();
    }
    let mut t = table(
        &[
            "NAME",
            "SYNC",
            "LAST SYNC",
            "DIRTY",
            "JOURNAL",
            "WRITTEN",
            "SYNCS OK/FAIL",
            "MEAN/MAX",
            "RESTORE",
            "LAST ERROR",
        ],
        &[3, 4, 5, 6],
    );
    for d in drives {
        let s = d.persist.as_ref().expect("filtered");
        let mean = (s.sync_count > 0).then(|| s.sync_seconds_total / s.sync_count as f64 * 1e6);
        t.add_row(vec![
            d.name.clone(),
            s.sync_state.clone(),
            s.last_sync_unix_ms.map_or_else(|| "never".into(), ago),
            format_size(s.dirty_bytes),
            format_size(s.journal_bytes),
            format_size(s.bytes_written),
            format!("{}/{}", s.syncs_ok, s.syncs_failed),
            format!(
                "{}/{}",
                micros(mean),
                micros(Some(s.max_sync_duration_ms * 1000.0))
            ),
            micros(s.restore_duration_ms.map(|m| m * 1000.0)),
            s.last_error.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    format!("\npersistence:\n{}", render(&t))
}

/// `ramd info` (no name): the daemon.
pub fn daemon_info(h: &Health) -> String {
    let mut t = table(&["FIELD", "VALUE"], &[]);
    let mut row = |k: &str, v: String| {
        t.add_row(vec![k.to_owned(), v]);
    };
    row("status", h.status.clone());
    row("version", h.version.clone());
    row("pid", h.pid.to_string());
    if let Some(sv) = &h.supervisor {
        row(
            "supervisor",
            format!(
                "pid {}{}, {} restart(s){}",
                sv.pid,
                if sv.alive {
                    ""
                } else {
                    " (GONE: a crash now loses RAM drives)"
                },
                sv.restarts,
                sv.last_restart_reason
                    .as_ref()
                    .map_or(String::new(), |r| format!(", last: {r}"))
            ),
        );
    }
    row("uptime", format!("{:.0}s", h.uptime_s));
    row("drives", h.drives.to_string());
    row(
        "memory budget",
        format!(
            "{} used, {} promised, {} limit",
            format_size(h.memory_budget.used_bytes),
            format_size(h.memory_budget.committed_bytes),
            format_size(h.memory_budget.limit_bytes)
        ),
    );
    row(
        "metrics",
        if h.metrics_enabled { "on" } else { "off" }.into(),
    );
    row("api socket", h.api_socket.clone());
    row("nbd socket", h.nbd_socket.clone());
    for a in &h.nbd_tcp {
        row("nbd tcp", a.clone());
    }
    row("state dir", h.state_dir.clone());
    row(
        "config",
        h.config_file.clone().unwrap_or_else(|| "-".into()),
    );
    render(&t)
}

/// A latency cell: p50/p99/p99.9 over the last second.
pub(super) fn latency_cell(l: Option<&Latency>) -> String {
    match l {
        Some(l) if l.count > 0 => format!(
            "{}/{}/{}",
            micros(l.p50_us),
            micros(l.p99_us),
            micros(l.p999_us)
        ),
        _ => "-".into(),
    }
}

/// `ramd stats`: one row per drive, rates over the last second, then the
/// caches' table (`caches`, made by the caller) and the budget.
pub fn stats(report: &StatsReport, caches: &str) -> String {
    let mut out = String::new();
    if !report.metrics_enabled {
        out.push_str("metrics are off (daemon started with --metrics off): memory only\n");
    }
    let mut t = table(
        &[
            "NAME",
            "IOPS R/W",
            "MiB/s R/W",
            "READ p50/p99/p99.9",
            "WRITE p50/p99/p99.9",
            "FLUSH p50/p99/p99.9",
            "MEMORY USED/LIMIT",
            "CONNS",
            "ERRORS",
        ],
        &[1, 2, 3, 4, 5, 7, 8],
    );
    for d in &report.drives {
        t.add_row(stats_row(d));
    }
    if !report.drives.is_empty() || report.caches.is_empty() {
        out.push_str(&render(&t));
        out.push_str(LATENCY_NOTE);
    }
    if !report.caches.is_empty() {
        if !report.drives.is_empty() {
            out.push('\n');
        }
        out.push_str(caches);
    }
    let b = &report.memory_budget;
    out.push_str(&format!(
        "budget: {} used of {} ({} promised to drives and caches)\n",
        format_size(b.used_bytes),
        format_size(b.limit_bytes),
        format_size(b.committed_bytes)
    ));
    out
}

/// What the latency columns measure (a client sees more).
const LATENCY_NOTE: &str =
    "latency: server-side, from a request read to its reply written (clients add their own and the transport's)\n";

fn stats_row(d: &DriveStats) -> Vec<String> {
    let mut row = vec![d.name.clone()];
    row.extend(rate_cells(d.rates.as_ref(), &["read", "write", "flush"]));
    // Memory against what bounds it: the drive's limit (its size says
    // nothing about memory: pages are allocated on first write).
    let limit = d
        .mem_limit_bytes
        .map_or_else(|| "no limit".to_owned(), format_size);
    row.extend([
        format!("{} / {limit}", format_size(d.allocated_bytes)),
        d.connections.to_string(),
        errors_cell(d.totals.as_ref()),
    ]);
    row
}

/// The request cells of a `ramd stats` row: IOPS and MiB/s (read/write),
/// then the latency of each of `ops`; "-" each without rates.
pub fn rate_cells(rates: Option<&StatsRates>, ops: &[&str]) -> Vec<String> {
    let Some(r) = rates else {
        return vec!["-".into(); 2 + ops.len()];
    };
    let mut cells = vec![
        format!("{}/{}", count_rate(r.read_iops), count_rate(r.write_iops)),
        format!(
            "{}/{}",
            mib_s(r.read_bytes_per_s),
            mib_s(r.write_bytes_per_s)
        ),
    ];
    cells.extend(ops.iter().map(|op| latency_cell(r.latency.get(*op))));
    cells
}

/// The errors cell of a `ramd stats` row: failed requests since start;
/// "-" without totals.
pub fn errors_cell(totals: Option<&StatsTotals>) -> String {
    totals.map_or("-".into(), |t| t.errors.values().sum::<u64>().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(micros(Some(850.0)), "850µs");
        assert_eq!(micros(Some(12_345.0)), "12.3ms");
        assert_eq!(micros(Some(1_200_000.0)), "1.20s");
        assert_eq!(micros(None), "-");
        assert_eq!(count_rate(12_345.0), "12.3k");
        assert_eq!(count_rate(2_500_000.0), "2.50M");
        assert_eq!(mib_s(3.0 * 1048576.0), "3.0");
    }

    #[test]
    fn tables_align_without_trailing_spaces() {
        let mut t = table(&["A", "NUMBER"], &[1]);
        t.add_row(vec!["long-name", "1"]);
        t.add_row(vec!["x", "12345"]);
        let s = render(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 3, "{s}");
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{s}");
        // Right-aligned numbers end in the same column.
        assert_eq!(lines[1].len(), lines[2].len(), "{s}");
    }
}
