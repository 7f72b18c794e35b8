//! `ramd cache create|list|info|sync|delete` and the caches' part of
//! `ramd sync`, `ramd list` and `ramd stats` (thin clients of /v1/caches).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use clap::Subcommand;

use super::drives::AccessArgs;
use super::output::{
    count_rate, errors_cell, export_rows, mib_s, micros, rate_cells, render, table, uris_cell,
};
use super::{arg_cache_name, arg_size, print_json, CliError, JsonFlag};
use crate::api::client::{Client, ClientError};
use crate::api::wire::caches::{
    BackingInfo, CacheCounters, CacheInfo, CacheSettings, CreateCache, DurationValue, PercentValue,
};
use crate::api::wire::values::SizeValue;
use crate::size::format_size;

/// `ramd cache ...`
#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Put a RAM cache in front of a file, a block device or an NBD export,
    /// and serve the result as the NBD export NAME (the backing's size).
    ///
    /// Examples:
    ///   ramd cache create db --backing /dev/sdb --size 2G --mode writeback
    ///   ramd cache create img --backing /srv/big.raw --size 4G --mode writethrough
    ///   ramd cache create remote --backing nbd://storage:10809/vol1 --size 1G --mode writearound
    ///   ramd cache create shared --backing /srv/shared.img --size 1G --mode writeback \
    ///       --allow-identity alice --read-only-identity bob --allow-network 10.0.0.0/8
    ///
    /// Modes: writethrough (acknowledged after the backing write), writearound
    /// (writes go to the backing and drop cached copies), writeback (writes
    /// stay in RAM and are written back in the background; FLUSH and FUA
    /// write back and flush the backing first, so a filesystem on top is as
    /// safe as on the bare disk). Access rules are the drives' (docs/tls.md,
    /// "Who may see an export"). See docs/cache.md.
    #[command(verbatim_doc_comment)]
    Create(Box<CreateArgs>),

    /// List caches: mode, size, use, dirty data, hit ratios, backing state.
    List {
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Show one cache: settings, counters, the backing's health (failing or
    /// not, last error, next retry) and request rates.
    Info {
        #[arg(value_parser = arg_cache_name)]
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Write back every dirty block and flush the backing; returns when it
    /// is durable (same as `ramd sync NAME`).
    Sync {
        #[arg(value_parser = arg_cache_name)]
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Delete a cache: writes back every dirty block first, then stops
    /// serving it (the backing keeps all data).
    ///
    /// Refused while the backing cannot take the dirty data, or while NBD
    /// clients are connected. --force closes the connections and, if the
    /// backing is dead, DROPS the dirty data (with a warning).
    Delete {
        #[arg(value_parser = arg_cache_name)]
        name: String,
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
}

/// `ramd cache create` flags (the option names of docs/cache.md).
#[derive(clap::Args, Debug)]
pub struct CreateArgs {
    /// Cache name, also the NBD export name: 1-64 of a-z 0-9 _ -.
    #[arg(value_parser = arg_cache_name)]
    name: String,
    /// What to cache: a file, a block device, nbd://HOST[:PORT]/EXPORT or
    /// nbd+unix:///EXPORT?socket=PATH.
    #[arg(long, value_name = "SRC")]
    backing: String,
    /// RAM for cached data: 512M, 2G, 1.5GiB (binary units).
    #[arg(long, value_name = "SIZE", value_parser = arg_size)]
    size: String,
    /// writethrough, writearound or writeback.
    #[arg(long, value_name = "MODE")]
    mode: String,
    /// Unit of caching, a power of two from 4K to 1M [default: 4K].
    #[arg(long, value_name = "SIZE", value_parser = arg_size)]
    block_size: Option<String>,
    /// Eviction: s3fifo (scan resistant), lru or fifo [default: s3fifo].
    #[arg(long, value_name = "POLICY")]
    policy: Option<String>,
    /// Sequential streams longer than this bypass the cache; 0: never
    /// [default: 4M].
    #[arg(long, value_name = "SIZE", value_parser = arg_size)]
    sequential_cutoff: Option<String>,
    /// Write-back starts when dirty data reaches this % of the cache
    /// [default: 50].
    #[arg(long, value_name = "PERCENT")]
    dirty_high: Option<String>,
    /// ...and stops at this % [default: 20].
    #[arg(long, value_name = "PERCENT")]
    dirty_low: Option<String>,
    /// Write back data dirty for longer than this [default: 30s].
    #[arg(long, value_name = "DURATION")]
    max_dirty_age: Option<String>,
    /// Largest write-back request [default: 1M].
    #[arg(long, value_name = "SIZE", value_parser = arg_size)]
    writeback_max_io: Option<String>,
    /// First wait before retrying a failing backing [default: 100ms]...
    #[arg(long, value_name = "DURATION")]
    retry_initial: Option<String>,
    /// ...doubled up to this [default: 30s].
    #[arg(long, value_name = "DURATION")]
    retry_max: Option<String>,
    /// Open a file or block device with O_DIRECT (no second copy in the
    /// host's page cache).
    #[arg(long)]
    direct: bool,
    /// Most connections to an NBD backing [default: 4].
    #[arg(long, value_name = "N")]
    nbd_connections: Option<u64>,
    /// Timeout of each NBD backing operation [default: 30s].
    #[arg(long, value_name = "DURATION")]
    nbd_timeout: Option<String>,
    /// At daemon shutdown, how long to retry a failing backing before the
    /// dirty data is saved to a rescue file instead [default: 2m].
    #[arg(long, value_name = "DURATION")]
    shutdown_timeout: Option<String>,
    /// Who may see the cache (change later with `ramd access NAME`).
    #[command(flatten)]
    access: AccessArgs,
    #[command(flatten)]
    out: JsonFlag,
}

fn size(v: &Option<String>) -> Option<SizeValue> {
    v.as_ref().map(|t| SizeValue::Text(t.clone()))
}

fn duration(v: &Option<String>) -> Option<DurationValue> {
    v.as_ref().map(|t| DurationValue::Text(t.clone()))
}

fn percent(v: &Option<String>) -> Option<PercentValue> {
    v.as_ref().map(|t| PercentValue::Text(t.clone()))
}

/// A backing as the daemon must see it: NBD URIs as given, a file or
/// device made absolute (the daemon's working directory is not ours).
fn backing_text(text: &str) -> Result<String, CliError> {
    if text.contains("://") {
        return Ok(text.to_owned());
    }
    Ok(super::absolute(std::path::Path::new(text))?
        .display()
        .to_string())
}

/// Runs `ramd cache ...`.
pub fn run(client: &Client, cmd: CacheCommand) -> Result<(), CliError> {
    match cmd {
        CacheCommand::Create(a) => {
            let c = client.create_cache(&CreateCache {
                name: a.name,
                backing: backing_text(&a.backing)?,
                size: SizeValue::Text(a.size),
                mode: a.mode,
                block_size: size(&a.block_size),
                policy: a.policy,
                sequential_cutoff: size(&a.sequential_cutoff),
                dirty_high: percent(&a.dirty_high),
                dirty_low: percent(&a.dirty_low),
                max_dirty_age: duration(&a.max_dirty_age),
                writeback_max_io: size(&a.writeback_max_io),
                retry_initial: duration(&a.retry_initial),
                retry_max: duration(&a.retry_max),
                direct: a.direct,
                nbd_connections: a.nbd_connections,
                nbd_timeout: duration(&a.nbd_timeout),
                shutdown_timeout: duration(&a.shutdown_timeout),
                access: (!a.access.is_empty()).then(|| a.access.clone().rules()),
            })?;
            if a.out.json {
                return print_json(&c);
            }
            println!(
                "created cache {} ({} {} over {}, {}) at {}",
                c.name,
                c.settings.mode,
                format_size(
                    c.stats
                        .as_ref()
                        .map_or(c.settings.cache_bytes, |s| s.capacity_bytes)
                ),
                c.backing.spec,
                c.size_bytes.map_or("-".into(), format_size),
                c.uri
            );
            println!("see it: ramd cache info {}", c.name);
        }
        CacheCommand::List { out } => {
            let l = client.list_caches()?;
            if out.json {
                return print_json(&l);
            }
            print!("{}", list(&l.caches));
        }
        CacheCommand::Info { name, out } => {
            let c = client.cache(&name)?;
            if out.json {
                return print_json(&c);
            }
            print!("{}", info(&c));
        }
        CacheCommand::Sync { name, out } => sync(client, &name, out.json)?,
        CacheCommand::Delete { name, force, out } => {
            let r = with_progress(client, &name, !out.json, |c| c.delete_cache(&name, force))?;
            if out.json {
                return print_json(&r);
            }
            if let Some(n) = &r.notice {
                eprintln!("note: {n}");
            }
            if r.dropped_dirty_bytes > 0 {
                eprintln!(
                    "warning: {} of dirty data that the backing could not take was DROPPED",
                    format_size(r.dropped_dirty_bytes)
                );
            }
            let mut what = vec![];
            if r.written_back_bytes > 0 {
                what.push(format!("wrote back {}", format_size(r.written_back_bytes)));
            }
            if r.closed_connections > 0 {
                what.push(format!(
                    "closed {} connection{}",
                    r.closed_connections,
                    if r.closed_connections == 1 { "" } else { "s" }
                ));
            }
            if what.is_empty() {
                println!("deleted cache {}", r.name);
            } else {
                println!("deleted cache {} ({})", r.name, what.join(", "));
            }
        }
    }
    Ok(())
}

/// Runs a call that writes a cache back (sync, delete: they wait as long
/// as the disk needs); on a terminal, shows the dirty data left and the
/// write-back rate on stderr meanwhile.
fn with_progress<T: Send>(
    client: &Client,
    name: &str,
    show: bool,
    call: impl FnOnce(&Client) -> Result<T, ClientError> + Send,
) -> Result<T, ClientError> {
    if !show || !std::io::stderr().is_terminal() {
        return call(client);
    }
    let target = client.target().clone();
    std::thread::scope(|s| {
        let h = s.spawn(|| call(&Client::to(target)));
        let started = Instant::now();
        let mut shown = false;
        // (written back so far, when) at the previous look, for the rate.
        let mut last: Option<(u64, Instant)> = None;
        while !h.is_finished() {
            std::thread::sleep(Duration::from_millis(250));
            if started.elapsed() < Duration::from_secs(1) || h.is_finished() {
                continue;
            }
            let Ok(Some(st)) = client.cache(name).map(|c| c.stats) else {
                continue;
            };
            let now = Instant::now();
            let rate = last.map_or(0.0, |(b, t)| {
                st.writeback_bytes.saturating_sub(b) as f64
                    / now.duration_since(t).as_secs_f64().max(1e-3)
            });
            last = Some((st.writeback_bytes, now));
            eprint!(
                "\r\x1b[Kwriting back cache '{name}': {} dirty left, {}/s",
                format_size(st.dirty_bytes),
                format_size(rate as u64)
            );
            shown = true;
        }
        if shown {
            eprint!("\r\x1b[K");
        }
        h.join().expect("the API call does not panic")
    })
}

/// `ramd cache sync NAME` / `ramd sync NAME` for a cache.
fn sync(client: &Client, name: &str, json: bool) -> Result<(), CliError> {
    let r = with_progress(client, name, !json, |c| c.sync_cache(name))?;
    if json {
        return print_json(&r);
    }
    println!(
        "synced cache {}: {} written back in {:.2}s, backing flushed{}",
        r.name,
        format_size(r.written_back_bytes),
        r.duration_ms as f64 / 1000.0,
        if r.dirty_bytes > 0 {
            format!(
                " ({} written since, still dirty)",
                format_size(r.dirty_bytes)
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

/// `ramd sync NAME` when NAME is a cache: syncs it and returns true;
/// false (nothing done) when no cache has that name, so the caller can
/// try drives.
pub fn sync_if_cache(client: &Client, name: &str, json: bool) -> Result<bool, CliError> {
    match client.cache(name) {
        Ok(_) => sync(client, name, json).map(|()| true),
        Err(ClientError::Api { code, .. }) if code == "cache_not_found" => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn pct(r: f64) -> String {
    format!("{:.1}%", r * 100.0)
}

/// The backing column: where, and its state when not healthy.
fn backing_cell(c: &CacheInfo) -> String {
    match c.backing.state.as_str() {
        "healthy" => c.backing.spec.clone(),
        s => format!("{} ({s})", c.backing.spec),
    }
}

/// `ramd cache list`.
pub fn list(caches: &[CacheInfo]) -> String {
    if caches.is_empty() {
        return "no caches (create one with: ramd cache create NAME --backing SRC --size 1G --mode writeback)\n".into();
    }
    let mut t = table(
        &[
            "NAME", "MODE", "SIZE", "CACHE", "USED", "DIRTY", "HIT R/W", "STATE", "CONNS",
            "BACKING", "URI",
        ],
        &[2, 3, 4, 5, 6, 8],
    );
    for c in caches {
        let s = c.stats.as_ref();
        t.add_row(vec![
            c.name.clone(),
            c.settings.mode.clone(),
            c.size_bytes.map_or("-".into(), format_size),
            format_size(s.map_or(c.settings.cache_bytes, |s| s.capacity_bytes)),
            s.map_or("-".into(), |s| format_size(s.resident_bytes)),
            s.map_or("-".into(), |s| format_size(s.dirty_bytes)),
            s.map_or("-".into(), |s| {
                format!("{}/{}", pct(s.read_hit_ratio), pct(s.write_hit_ratio))
            }),
            c.state.clone(),
            c.connections.to_string(),
            backing_cell(c),
            uris_cell(&c.uri, &c.tcp_uris),
        ]);
    }
    render(&t)
}

fn ms(v: u64) -> String {
    micros(Some(v as f64 * 1000.0))
}

/// A row of a FIELD/VALUE table.
type Row<'a> = dyn FnMut(&str, String) + 'a;

/// `ramd cache info NAME`.
pub fn info(c: &CacheInfo) -> String {
    let mut t = table(&["FIELD", "VALUE"], &[]);
    let mut row = |k: &str, v: String| {
        t.add_row(vec![k.to_owned(), v]);
    };
    identity_rows(&mut row, c);
    backing_rows(&mut row, &c.backing);
    if let Some(s) = &c.stats {
        counter_rows(&mut row, s);
    }
    if let Some(r) = c.io.as_ref().and_then(|io| io.rates.as_ref()) {
        row(
            "requests",
            format!(
                "{}/{} IOPS, {}/{} MiB/s read/write (last second)",
                count_rate(r.read_iops),
                count_rate(r.write_iops),
                mib_s(r.read_bytes_per_s),
                mib_s(r.write_bytes_per_s)
            ),
        );
    }
    settings_rows(&mut row, &c.settings, &c.backing.kind);
    row("memory promised", format_size(c.promised_bytes));
    row("access", super::output::access_text(&c.access));
    export_rows(
        &mut row,
        c.connections,
        &c.attachments,
        &c.origin,
        &c.uri,
        &c.tcp_uris,
    );
    super::output::nvme_rows(&mut row, &c.nvme_nqn, &c.nvme_hosts);
    for s in &c.snapshots {
        row(
            &format!("snapshots to {}", s.remote),
            super::output::snapshot_text(s),
        );
    }
    render(&t)
}

/// Name, state, mode and size.
fn identity_rows(row: &mut Row, c: &CacheInfo) {
    let st = &c.settings;
    row("name", c.name.clone());
    row("state", c.state.clone());
    row(
        "mode",
        format!(
            "{} (policy {}, blocks of {})",
            st.mode,
            st.policy,
            format_size(st.block_bytes)
        ),
    );
    row(
        "size",
        c.size_bytes.map_or("- (backing not open)".into(), |s| {
            format!("{} ({s} bytes, the backing's)", format_size(s))
        }),
    );
}

/// The backing: where, its health, its last error and error counts.
fn backing_rows(row: &mut Row, b: &BackingInfo) {
    row("backing", format!("{} ({})", b.spec, b.kind));
    let health = match b.state.as_str() {
        "failing" => format!(
            "FAILING for {}: requests that need it get EIO, cached data is served, dirty data is kept; next retry in {}",
            ms(b.failing_for_ms),
            ms(b.next_retry_in_ms)
        ),
        "unavailable" => format!(
            "UNAVAILABLE: not opened yet ({} attempt{}); next attempt in {}",
            b.open_attempts,
            if b.open_attempts == 1 { "" } else { "s" },
            ms(b.next_retry_in_ms)
        ),
        s => s.to_owned(),
    };
    row("backing state", health);
    if let Some(e) = &b.last_error {
        row("last error", e.clone());
    }
    row(
        "backing errors",
        format!(
            "{} read, {} write, {} flush; {} retries",
            b.read_errors, b.write_errors, b.flush_errors, b.retries
        ),
    );
}

/// The cache's counters (once the backing is open).
fn counter_rows(row: &mut Row, s: &CacheCounters) {
    row(
        "cache",
        format!(
            "{} used of {}, {} dirty",
            format_size(s.resident_bytes),
            format_size(s.capacity_bytes),
            format_size(s.dirty_bytes)
        ),
    );
    row(
        "reads",
        format!(
            "{} hit ratio ({} hits, {} misses, in blocks)",
            pct(s.read_hit_ratio),
            s.read_hits,
            s.read_misses
        ),
    );
    row(
        "writes",
        format!(
            "{} hit ratio ({} hits, {} misses, in blocks)",
            pct(s.write_hit_ratio),
            s.write_hits,
            s.write_misses
        ),
    );
    row(
        "evictions",
        format!("{} ({} invalidations)", s.evictions, s.invalidations),
    );
    row(
        "write-back",
        format!(
            "{} in total, {}/s lately, oldest dirty block {}",
            format_size(s.writeback_bytes),
            format_size(s.writeback_rate_bytes_per_s),
            if s.dirty_bytes == 0 {
                "-".into()
            } else {
                ms(s.writeback_lag_ms)
            }
        ),
    );
    row(
        "bypassed",
        format!(
            "{} requests, {}",
            s.bypassed_requests,
            format_size(s.bypassed_bytes)
        ),
    );
    row(
        "backing i/o",
        format!(
            "{} read, {} written",
            format_size(s.backing_read_bytes),
            format_size(s.backing_write_bytes)
        ),
    );
}

/// How the cache was set up: watermarks, cutoff, retries, backing options.
fn settings_rows(row: &mut Row, st: &CacheSettings, backing_kind: &str) {
    row(
        "watermarks",
        format!(
            "write back from {}% down to {}% dirty, or after {}; up to {} per write",
            st.dirty_high_percent,
            st.dirty_low_percent,
            ms(st.max_dirty_age_ms),
            format_size(st.writeback_max_io_bytes)
        ),
    );
    row(
        "sequential cutoff",
        if st.sequential_cutoff_bytes == 0 {
            "off".into()
        } else {
            format_size(st.sequential_cutoff_bytes)
        },
    );
    row(
        "retries",
        format!(
            "{} doubling to {}",
            ms(st.retry_initial_ms),
            ms(st.retry_max_ms)
        ),
    );
    if backing_kind == "nbd" {
        row(
            "nbd",
            format!(
                "{} connection(s), {} timeout",
                st.nbd_connections,
                ms(st.nbd_timeout_ms)
            ),
        );
    } else {
        row("o_direct", if st.direct { "yes" } else { "no" }.into());
    }
    row("shutdown timeout", ms(st.shutdown_timeout_ms));
}

/// The caches' table of `ramd stats`: request rates of the last second
/// and the cache's own numbers (ratios since creation).
pub fn stats_section(caches: &[CacheInfo]) -> String {
    let mut t = table(
        &[
            "CACHE",
            "IOPS R/W",
            "MiB/s R/W",
            "READ p50/p99/p99.9",
            "WRITE p50/p99/p99.9",
            "HIT R/W",
            "DIRTY",
            "WB RATE",
            "WB LAG",
            "BACKING",
            "ERRORS",
        ],
        &[1, 2, 3, 4, 5, 6, 7, 8, 10],
    );
    for c in caches {
        let io = c.io.as_ref();
        let s = c.stats.as_ref();
        let mut row = vec![c.name.clone()];
        row.extend(rate_cells(
            io.and_then(|io| io.rates.as_ref()),
            &["read", "write"],
        ));
        row.extend([
            s.map_or("-".into(), |s| {
                format!("{}/{}", pct(s.read_hit_ratio), pct(s.write_hit_ratio))
            }),
            s.map_or("-".into(), |s| format_size(s.dirty_bytes)),
            s.map_or("-".into(), |s| {
                format!("{}/s", format_size(s.writeback_rate_bytes_per_s))
            }),
            s.map_or("-".into(), |s| {
                if s.dirty_bytes == 0 {
                    "-".into()
                } else {
                    ms(s.writeback_lag_ms)
                }
            }),
            c.backing.state.clone(),
            errors_cell(io.and_then(|io| io.totals.as_ref())),
        ]);
        t.add_row(row);
    }
    render(&t)
}
