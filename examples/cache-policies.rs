//! Prints the eviction-policy comparison recorded in bench/cache-policies.md:
//! hit ratios of S3-FIFO, LRU and FIFO on a zipf working set twice the
//! cache, with and without scans. Deterministic (seeded), so any machine
//! prints the same table.
//!
//!     cargo run --release --example cache-policies [SLOTS] [SEED]

use ramd::sim::policy::standard_comparison;

fn main() {
    let mut args = std::env::args().skip(1);
    let slots: usize = args
        .next()
        .map_or(65_536, |a| a.parse().expect("SLOTS is a number"));
    let seed: u64 = args
        .next()
        .map_or(42, |a| a.parse().expect("SEED is a number"));
    println!(
        "cache of {slots} blocks, working set {} blocks, {} accesses per workload, seed {seed}\n",
        2 * slots,
        40 * slots
    );
    println!("| workload | policy | hit ratio | hit ratio (working set only) |");
    println!("|---|---|---|---|");
    for r in standard_comparison(slots, seed) {
        println!(
            "| {} | {} | {:.2}% | {:.2}% |",
            r.workload,
            r.policy,
            100.0 * r.result.hit_ratio(),
            100.0 * r.result.ws_hit_ratio()
        );
    }
}
