//! Runs one dirsync sync (the engine `ramd dir sync` uses) from SRC to DST
//! and prints its report as JSON: used by bench/dirsync.sh to time it beside
//! `rsync -a`.
//!
//! ```text
//! cargo run --release --example dirsync_sync -- SRC DST [--no-fsync]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use ramd::dirsync::sync::{sync_tree, SyncOptions};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if paths.len() != 2 {
        anyhow::bail!("usage: dirsync_sync SRC DST [--no-fsync]");
    }
    let opts = SyncOptions {
        durable: !args.iter().any(|a| a == "--no-fsync"),
        ..SyncOptions::default()
    };
    let (src, dst) = (PathBuf::from(paths[0]), PathBuf::from(paths[1]));
    std::fs::create_dir_all(&dst)?;
    let start = Instant::now();
    let report = sync_tree(&src, &dst, &opts)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({ "seconds": secs, "durable": opts.durable, "report": report })
    );
    Ok(())
}
