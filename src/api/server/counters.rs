//! Request counters and rates as the API shows them: the metrics module's
//! totals and the sampler's last-second window turned into wire values,
//! for drives (`stats.rs`) and caches (`caches.rs`) alike.

use std::collections::BTreeMap;

use crate::api::wire::values::{Latency, StatsRates, StatsTotals};
use crate::control::sampler::Window;
use crate::metrics::{Histogram, Op, Timed, Totals, ERRNOS};

fn latency(h: &Histogram) -> Latency {
    let count = h.count();
    let us = |q: f64| h.quantile_ns(q).map(|ns| ns as f64 / 1000.0);
    Latency {
        count,
        mean_us: (count > 0).then(|| h.sum_ns as f64 / count as f64 / 1000.0),
        p50_us: us(0.5),
        p90_us: us(0.9),
        p99_us: us(0.99),
        p999_us: us(0.999),
    }
}

fn latencies(t: &Totals) -> BTreeMap<String, Latency> {
    Timed::ALL
        .iter()
        .map(|&k| (k.name().to_owned(), latency(t.latency(k))))
        .collect()
}

pub(crate) fn totals(t: &Totals) -> StatsTotals {
    StatsTotals {
        ops: Op::ALL
            .iter()
            .map(|&o| (o.name().to_owned(), t.ops(o)))
            .collect(),
        bytes: Op::ALL
            .iter()
            .map(|&o| (o.name().to_owned(), t.bytes(o)))
            .collect(),
        errors: ERRNOS
            .iter()
            .enumerate()
            .map(|(i, (_, name))| ((*name).to_owned(), t.errors[i]))
            .collect(),
        connections_opened: t.connections_total,
        latency: latencies(t),
    }
}

pub(crate) fn rates(w: &Window) -> StatsRates {
    let s = w.interval.as_secs_f64().max(1e-9);
    let t = &w.delta;
    StatsRates {
        interval_s: w.interval.as_secs_f64(),
        iops: t.ops.iter().sum::<u64>() as f64 / s,
        read_iops: t.ops(Op::Read) as f64 / s,
        write_iops: t.ops(Op::Write) as f64 / s,
        read_bytes_per_s: t.bytes(Op::Read) as f64 / s,
        write_bytes_per_s: t.bytes(Op::Write) as f64 / s,
        latency: latencies(t),
    }
}
