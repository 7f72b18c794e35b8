//! What the daemon reports: `ramd stats [NAME] [--watch]` and `ramd info
//! [NAME]` (a drive, a cache of that name, or the daemon itself).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use super::{caches, dirs, output, print_json, CliError};
use crate::api::client::{Client, ClientError};
use crate::api::wire::drives::CompressionInfo;
use crate::api::wire::stats::StatsReport;
use crate::size::format_size;

/// `ramd info [NAME]`: a drive, else a cache of that name; the daemon
/// without a name.
pub(crate) fn info(c: &Client, name: Option<&str>, json: bool) -> Result<(), CliError> {
    let Some(name) = name else {
        let h = c.health()?;
        if json {
            return print_json(&h);
        }
        print!("{}", output::daemon_info(&h));
        return Ok(());
    };
    let d = match c.drive(name) {
        Ok(d) => d,
        // A cache's name shows the cache.
        Err(e) if e.code() == Some("drive_not_found") => match c.cache(name) {
            Ok(cache) if json => return print_json(&cache),
            Ok(cache) => {
                print!("{}", caches::info(&cache));
                return Ok(());
            }
            Err(_) => return Err(e.into()),
        },
        Err(e) => return Err(e.into()),
    };
    if json {
        return print_json(&d);
    }
    let mut d = d;
    if !d.attachments.is_empty() {
        // Say which path serves each attachment (threads or io_uring).
        let all = c.attachments()?.attachments;
        for mp in d.attachments.iter_mut() {
            if let Some(a) = all.iter().find(|a| a.mountpoint == *mp) {
                *mp = format!("{mp} ({}, {} queues)", a.path, a.queues);
            }
        }
    }
    print!("{}", output::drive_info(&d));
    if let Some(z) = &d.compression {
        print!("{}", compression_lines(z));
    }
    Ok(())
}

/// A compressed drive's figures, for `ramd info` (zram's `mm_stat`).
fn compression_lines(z: &CompressionInfo) -> String {
    format!(
        "compression  {}, ratio {:.2} ({} of data in {} of memory)\n  stored     {} compressed in {} of slabs + {} metadata\n  pages      {} compressed, {} same-filled, {} incompressible\n  compaction {} runs, {} objects moved, {} freed\n{}",
        z.algorithm,
        z.ratio,
        format_size(z.orig_data_bytes),
        format_size(z.mem_used_bytes),
        format_size(z.compr_data_bytes),
        format_size(z.slab_bytes),
        format_size(z.metadata_bytes),
        z.compressed_pages,
        z.same_pages,
        z.huge_pages,
        z.compact_runs,
        z.compact_moved_objects,
        format_size(z.compact_freed_bytes),
        recompression_line(z),
    )
}

/// `lz4+zstd` drives: what the recompression of idle pages did.
fn recompression_line(z: &CompressionInfo) -> String {
    if !z.algorithm.contains('+') {
        return String::new();
    }
    format!(
        "  recompress {} pages held by the second codec ({} tried), {} saved, {:.1} s CPU, {} urgent sweeps\n",
        z.recompressed_pages,
        z.recompress_attempts,
        format_size(z.recompress_saved_bytes),
        z.recompress_cpu_ms as f64 / 1000.0,
        z.urgent_sweeps,
    )
}

/// `ramd stats`' section of compressed drives (empty when none).
fn compression_section(report: &StatsReport) -> String {
    let mut out = String::new();
    for d in &report.drives {
        let Some(z) = &d.compression else { continue };
        if out.is_empty() {
            out.push_str("\ncompressed drives: data / used = ratio (same-filled, incompressible pages; compaction moves)\n");
        }
        out.push_str(&format!(
            "  {:<16} {} {} / {} = {:.2}x ({} same, {} huge; {} moved)\n",
            d.name,
            z.algorithm,
            format_size(z.orig_data_bytes),
            format_size(z.mem_used_bytes),
            z.ratio,
            z.same_pages,
            z.huge_pages,
            z.compact_moved_objects,
        ));
    }
    out
}

/// `ramd stats`: one report, or one a second with `--watch`.
pub(crate) fn stats(
    client: &Client,
    name: Option<&str>,
    watch: bool,
    count: Option<u64>,
    json: bool,
) -> Result<(), CliError> {
    let tty = std::io::stdout().is_terminal();
    let mut shown = 0u64;
    loop {
        let mut report = client.stats()?;
        if let Some(n) = name {
            report.drives.retain(|d| d.name == n);
            report.caches.retain(|c| c.name == n);
            if report.drives.is_empty() && report.caches.is_empty() {
                return Err(ClientError::Api {
                    status: 404,
                    code: "drive_not_found".into(),
                    message: format!(
                        "no drive named '{n}', nor a cache (see `ramd list` and `ramd cache list`)"
                    ),
                }
                .into());
            }
        }
        let mut out = std::io::stdout().lock();
        if json {
            // One JSON document per refresh (one line each with --watch).
            let text = if watch {
                serde_json::to_string(&report)
            } else {
                serde_json::to_string_pretty(&report)
            }?;
            let _ = writeln!(out, "{text}");
        } else {
            if watch && tty {
                let _ = write!(out, "\x1b[H\x1b[2J");
            }
            let caches = caches::stats_section(&report.caches);
            let _ = write!(out, "{}", output::stats(&report, &caches));
            let _ = write!(out, "{}", output::persist_stats(&report));
            let _ = write!(out, "{}", compression_section(&report));
            if name.is_none() {
                let _ = write!(out, "{}", dirs::stats_section(client));
            }
            if watch && !tty {
                let _ = writeln!(out);
            }
        }
        let _ = out.flush();
        shown += 1;
        if !watch || count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
