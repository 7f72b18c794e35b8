//! The report (pure): what was measured, as `api::wire::bench`'s types,
//! with fio's figures and the ratios the table shows.

use std::time::Duration;

use super::latency::{histogram_us, percentiles, Recorder};
use super::profile::{Pattern, TestSpec};
use crate::api::wire::bench::{BenchComparison, BenchResult, BenchTest};

/// A test as the report describes it.
pub fn test_info(t: &TestSpec) -> BenchTest {
    BenchTest {
        name: t.name.into(),
        description: t.description.into(),
        rw: t.pattern.fio_name().into(),
        read_pct: t.read_pct,
        block_bytes: t.block_bytes,
        iodepth: t.iodepth,
        jobs: t.jobs,
    }
}

/// The figures of `test` on `target` from what its jobs recorded over
/// `elapsed`.
pub fn result(target: &str, test: &TestSpec, rec: &Recorder, elapsed: Duration) -> BenchResult {
    let total = rec.total();
    let all = total.direction(elapsed);
    let reads = test.read_pct > 0 || rec.read.ios > 0;
    let writes = test.pattern.writes() || rec.write.ios > 0;
    BenchResult {
        target: target.into(),
        test: test.name.into(),
        iops: all.iops,
        mib_s: all.mib_s,
        ios: all.ios,
        bytes: all.bytes,
        elapsed_s: (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        errors: rec.errors,
        lat_us: all.lat_us,
        read: reads.then(|| rec.read.direction(elapsed)),
        write: writes.then(|| rec.write.direction(elapsed)),
        percentiles_us: percentiles(&total),
        histogram_us: histogram_us(&total),
    }
}

/// `a / b`, rounded to 3 significant decimals; 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b <= 0.0 {
        return 0.0;
    }
    let r = a / b;
    (r * 1000.0).round() / 1000.0
}

/// The first target against each other one, per test that both ran.
pub fn comparisons(targets: &[String], results: &[BenchResult]) -> Vec<BenchComparison> {
    let Some((first, others)) = targets.split_first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for r in results.iter().filter(|r| &r.target == first) {
        for other in others {
            let Some(b) = results
                .iter()
                .find(|b| &b.target == other && b.test == r.test)
            else {
                continue;
            };
            out.push(BenchComparison {
                test: r.test.clone(),
                target: first.clone(),
                baseline: other.clone(),
                iops_ratio: ratio(r.iops, b.iops),
                mib_s_ratio: ratio(r.mib_s, b.mib_s),
                lat_mean_ratio: ratio(r.lat_us.mean, b.lat_us.mean),
                lat_p50_ratio: ratio(r.lat_us.p50, b.lat_us.p50),
                lat_p99_ratio: ratio(r.lat_us.p99, b.lat_us.p99),
            });
        }
    }
    out
}

/// Whether `test` can run on a target of `kind` (`target::Kind::name`),
/// or why not.
pub fn applies(test: &TestSpec, kind: &str) -> Result<(), &'static str> {
    if test.pattern == Pattern::Files && kind != "directory" {
        return Err("the file-level test needs a directory: compare a directory in RAM (ramd dir add, or a tmpfs) with the disk directory it replaces");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::profile::find;

    #[test]
    fn results_and_ratios() {
        let t = find("randrw-4k-qd1").unwrap();
        let mut fast = Recorder::default();
        let mut slow = Recorder::default();
        for _ in 0..1000 {
            fast.read.record(10_000, 4096);
            fast.write.record(20_000, 4096);
            slow.read.record(100_000, 4096);
            slow.write.record(200_000, 4096);
        }
        let a = result("ram", &t, &fast, Duration::from_secs(1));
        let b = result("disk", &t, &slow, Duration::from_secs(2));
        assert_eq!(a.iops, 2000.0);
        assert_eq!(b.iops, 1000.0);
        assert_eq!(a.read.as_ref().unwrap().iops, 1000.0);
        assert_eq!(a.write.as_ref().unwrap().lat_us.max, 20.0);
        assert_eq!(a.percentiles_us.len(), 17);
        assert_eq!(a.histogram_us.iter().map(|h| h[1]).sum::<f64>(), 2000.0);
        let c = comparisons(&["ram".into(), "disk".into()], &[a, b]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].iops_ratio, 2.0);
        assert_eq!(c[0].lat_mean_ratio, 0.1);
        assert!(comparisons(&[], &[]).is_empty());

        let files = find("files-4k").unwrap();
        assert!(applies(&files, "drive").is_err());
        assert!(applies(&files, "directory").is_ok());
        assert!(applies(&t, "drive").is_ok());
        let seq = find("seqread-1m").unwrap();
        let r = result("x", &seq, &Recorder::default(), Duration::from_secs(1));
        assert!(r.read.is_some() && r.write.is_none());
        assert_eq!(r.iops, 0.0);
    }
}
