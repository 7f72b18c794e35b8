//! The `ramd` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use ramd::backend::Backend;
use ramd::nbd::{Export, ExportTable, Server, ServerConfig};
use ramd::size::{format_size, parse_size};
use ramd::store::{MemoryBudget, RamStore};

/// RAM drives served over NBD.
///
/// ramd keeps block devices in memory (allocated only when written, returned
/// on trim) and serves each one as an NBD export, so qemu, nbdinfo, nbdcopy,
/// fio and the kernel's nbd client can use it.
#[derive(Parser)]
#[command(name = "ramd", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve RAM drives over NBD in the foreground until SIGINT/SIGTERM.
    ///
    /// Examples:
    ///   ramd serve                                  # one 1 GiB drive named ram0
    ///   ramd serve --drive db=4G --drive scratch=512M,mem-limit=256M
    ///   ramd serve --socket /tmp/nbd.sock --nbd-listen 127.0.0.1:10809
    ///
    /// Then: nbdinfo 'nbd+unix:///ram0?socket=/run/ramd/nbd.sock'
    #[command(verbatim_doc_comment)]
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// NBD unix socket path [default: $XDG_RUNTIME_DIR/ramd/nbd.sock, or
    /// /run/ramd/nbd.sock for root]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,

    /// A drive: NAME=SIZE[,mem-limit=SIZE][,read-only]. Repeat for more
    /// drives; the first is also the default export (empty name). Sizes take
    /// binary units: 512, 4K, 1.5G, 2GiB. [default: ram0=1G]
    #[arg(long = "drive", value_name = "SPEC")]
    drives: Vec<String>,

    /// Also listen on this TCP address (e.g. 127.0.0.1:10809). Repeatable.
    #[arg(long = "nbd-listen", value_name = "ADDR")]
    nbd_listen: Vec<SocketAddr>,

    /// Memory all drives together may hold [default: 75% of MemAvailable].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    mem_budget: Option<u64>,

    /// Most NBD connections served at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_connections: usize,

    /// Microseconds a connection polls for its next request before sleeping.
    /// Cuts latency on VMs where waking a sleeping CPU is slow; 0 disables.
    #[arg(long, default_value_t = ramd::nbd::server::DEFAULT_POLL_US, value_name = "US")]
    poll_us: u32,

    /// Log filter (error, warn, info, debug, trace) [env: RUST_LOG].
    #[arg(long, value_name = "LEVEL")]
    log: Option<String>,
}

/// A parsed `--drive` spec.
struct DriveSpec {
    name: String,
    size: u64,
    mem_limit: Option<u64>,
    read_only: bool,
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

fn parse_drive(spec: &str) -> Result<DriveSpec> {
    let mut parts = spec.split(',');
    let head = parts.next().unwrap_or_default();
    let Some((name, size)) = head.split_once('=') else {
        bail!("--drive '{spec}': expected NAME=SIZE, like ram0=1G");
    };
    if !valid_name(name) {
        bail!("--drive '{spec}': invalid name '{name}': use 1-64 of a-z 0-9 _ -, starting with a letter or digit");
    }
    let size = parse_size(size).map_err(|e| anyhow::anyhow!("--drive '{spec}': {e}"))?;
    if size == 0 {
        bail!("--drive '{spec}': size must be at least 1 byte");
    }
    let mut d = DriveSpec {
        name: name.to_owned(),
        size,
        mem_limit: None,
        read_only: false,
    };
    for opt in parts {
        match opt.split_once('=') {
            Some(("mem-limit", v)) => {
                d.mem_limit =
                    Some(parse_size(v).map_err(|e| anyhow::anyhow!("--drive '{spec}': {e}"))?)
            }
            None if opt == "read-only" || opt == "ro" => d.read_only = true,
            _ => {
                bail!("--drive '{spec}': unknown option '{opt}' (known: mem-limit=SIZE, read-only)")
            }
        }
    }
    Ok(d)
}

fn init_logging(level: Option<&str>) {
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::new(l),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Blocks SIGINT and SIGTERM in every thread (call before spawning any) and
/// returns a waiter that takes them synchronously.
fn block_shutdown_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use;
    // pthread_sigmask only changes this thread's mask (inherited by threads
    // spawned later).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    let signals = block_shutdown_signals();
    init_logging(args.log.as_deref());
    let specs: Vec<DriveSpec> = if args.drives.is_empty() {
        vec![parse_drive("ram0=1G")?]
    } else {
        args.drives
            .iter()
            .map(|s| parse_drive(s))
            .collect::<Result<_>>()?
    };
    let budget = Arc::new(match args.mem_budget {
        Some(b) => MemoryBudget::new(b),
        None => MemoryBudget::default_daemon(),
    });
    let exports = Arc::new(ExportTable::new());
    for d in &specs {
        let store = RamStore::new(d.size, d.mem_limit, budget.clone())
            .with_context(|| format!("cannot create drive '{}'", d.name))?;
        let desc = format!("ramd RAM drive, {}", format_size(d.size));
        let export = Export::new(
            &d.name,
            &desc,
            Arc::new(store) as Arc<dyn Backend>,
            d.read_only,
        );
        if !exports.insert(Arc::new(export)) {
            bail!("drive name '{}' is given twice", d.name);
        }
    }
    let socket = args.socket.unwrap_or_else(ramd::paths::nbd_socket);
    let mut config = ServerConfig::new(&socket);
    config.tcp = args.nbd_listen;
    config.max_connections = args.max_connections;
    config.poll_us = args.poll_us;
    let server = Server::bind(config, exports.clone()).context("cannot start the NBD server")?;
    let sock = socket.display();
    tracing::info!(
        "memory budget {} (drives allocate only what is written)",
        format_size(budget.limit_bytes())
    );
    for d in &specs {
        tracing::info!(
            "drive {} ({}{}) at nbd+unix:///{}?socket={sock}",
            d.name,
            format_size(d.size),
            if d.read_only { ", read-only" } else { "" },
            d.name
        );
        for addr in server.tcp_addrs() {
            tracing::info!("drive {} also at nbd://{addr}/{}", d.name, d.name);
        }
    }
    tracing::info!(
        "try: nbdinfo 'nbd+unix:///{}?socket={sock}'   stop with Ctrl-C",
        specs[0].name
    );
    let handle = server.shutdown_handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `signals` is an initialised sigset and `sig` a valid out
            // pointer; the signals are blocked in every thread.
            unsafe { libc::sigwait(&signals, &mut sig) };
            tracing::info!("signal {sig}: finishing open requests and shutting down");
            handle.shutdown();
        })?;
    server.run()?;
    tracing::info!("stopped");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ramd: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_specs() {
        let d = parse_drive("db=4G,mem-limit=1G,ro").unwrap();
        assert_eq!(
            (d.name.as_str(), d.size, d.mem_limit, d.read_only),
            ("db", 4 << 30, Some(1 << 30), true)
        );
        assert!(parse_drive("Bad=1G").is_err());
        assert!(parse_drive("x=12Q").is_err());
        assert!(parse_drive("x").is_err());
        assert!(parse_drive("x=0").is_err());
        assert!(parse_drive("x=1G,turbo").is_err());
    }
}
