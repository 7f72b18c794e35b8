//! Serves caches (and plain RAM drives, for comparison) over NBD until
//! SIGINT/SIGTERM, then closes every cache cleanly (dirty data written
//! back): caches without the daemon, its API and its metrics, for
//! comparisons (bench/cache.sh SERVE=example) and experiments:
//!
//!     cargo run --release --example cache-serve -- --socket /tmp/c.sock \
//!         --cache c0=nbd+unix:///?socket=/tmp/slow.sock,size=1G,mode=writeback \
//!         --drive ram0=1G
//!
//! A cache spec is NAME=SRC followed by `,key=value` options (the names of
//! `CacheConfig::set`: size, mode, block-size, policy, sequential-cutoff,
//! dirty-high, dirty-low, max-dirty-age, ...) and `,direct` for O_DIRECT.
//! SRC may itself contain commas only if it is the last thing before the
//! first `,key=` option. SIGUSR1 prints every cache's stats to stderr.

use std::sync::Arc;

use ramd::block::backend::Backend;
use ramd::cache::{BackingOptions, Cache, CacheConfig, Mode};
use ramd::nbd::{Export, ExportTable, Server, ServerConfig};
use ramd::size::parse as parse_size;
use ramd::store::{MemoryBudget, RamStore};

fn usage() -> ! {
    eprintln!(
        "usage: cache-serve --socket PATH [--cache NAME=SRC,size=SIZE,mode=MODE[,key=value...][,direct]]... [--drive NAME=SIZE]..."
    );
    std::process::exit(2)
}

fn parse_cache(spec: &str) -> Result<(String, String, CacheConfig, BackingOptions), String> {
    let (name, rest) = spec.split_once('=').ok_or("expected NAME=SRC,...")?;
    // The source ends where the first known `,key=` option starts.
    let keys = [
        "size",
        "mode",
        "block-size",
        "policy",
        "sequential-cutoff",
        "dirty-high",
        "dirty-low",
        "max-dirty-age",
        "writeback-max-io",
        "retry-initial",
        "retry-max",
        "direct",
    ];
    let mut cut = rest.len();
    for k in keys {
        for pat in [format!(",{k}="), format!(",{k}")] {
            if let Some(i) = rest.find(&pat) {
                let after = &rest[i + pat.len()..];
                if pat.ends_with('=') || after.is_empty() || after.starts_with(',') {
                    cut = cut.min(i);
                }
            }
        }
    }
    let (src, opts) = rest.split_at(cut);
    let mut cfg = CacheConfig::new(Mode::WriteThrough, 0);
    let mut bopts = BackingOptions::default();
    for o in opts.split(',').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some((k, v)) => cfg.set(k, v).map_err(|e| e.to_string())?,
            None if o == "direct" => bopts.direct_io = true,
            None => return Err(format!("unknown option '{o}'")),
        }
    }
    Ok((name.to_owned(), src.to_owned(), cfg, bopts))
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // Block the stop signals in every thread; one thread waits for them.
    // SAFETY: plain libc signal-mask calls on a local, initialised sigset.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    let exports = Arc::new(ExportTable::new());
    let budget = Arc::new(MemoryBudget::default_daemon());
    let mut caches = Vec::new();
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--socket" => socket = Some(v),
            "--cache" => {
                let (name, src, cfg, bopts) = parse_cache(&v).unwrap_or_else(|e| {
                    eprintln!("--cache {v}: {e}");
                    std::process::exit(2)
                });
                let cache = Arc::new(
                    Cache::open(&src, cfg, &bopts, Some(budget.clone())).unwrap_or_else(|e| {
                        eprintln!("--cache {v}: {e}");
                        std::process::exit(1)
                    }),
                );
                let desc = format!("ramd cache ({}) over {src}", cache.config().mode);
                exports.insert(Arc::new(Export::new(
                    &name,
                    &desc,
                    cache.clone() as Arc<dyn Backend>,
                    false,
                )));
                caches.push((name, cache));
            }
            "--drive" => {
                let (name, size) = v.split_once('=').unwrap_or_else(|| usage());
                let size = parse_size(size).unwrap_or_else(|e| {
                    eprintln!("--drive {v}: {e}");
                    std::process::exit(2)
                });
                let store = RamStore::new(size, None, budget.clone()).expect("create the drive");
                exports.insert(Arc::new(Export::new(
                    name,
                    "ramd RAM drive",
                    Arc::new(store),
                    false,
                )));
            }
            _ => usage(),
        }
    }
    let socket = socket.unwrap_or_else(|| usage());
    let server = Server::bind(ServerConfig::new(&socket), exports).expect("bind the NBD socket");
    let handle = server.shutdown_handle();
    let shown = caches.clone();
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: `set` is an initialised sigset, `sig` a valid out pointer.
        unsafe { libc::sigwait(&set, &mut sig) };
        if sig == libc::SIGUSR1 {
            // A snapshot for benchmarks: one line per cache.
            for (name, c) in &shown {
                print_stats(name, c);
            }
            continue;
        }
        handle.shutdown();
        return;
    });
    tracing::info!("serving on {socket}");
    server.run().expect("serve");
    for (name, c) in caches {
        print_stats(&name, &c);
        if let Err(e) = c.close(false) {
            eprintln!("cache {name}: {e}");
        }
    }
}

fn print_stats(name: &str, c: &Cache) {
    let s = c.stats();
    eprintln!(
        "cache {name}: read hit ratio {:.4} ({} hits, {} misses), write hit ratio {:.4}, {} evictions, {} bytes bypassed, {} bytes written back",
        s.read_hit_ratio(),
        s.read_hits,
        s.read_misses,
        s.write_hit_ratio(),
        s.evictions,
        s.bypassed_bytes,
        s.writeback_bytes
    );
}
