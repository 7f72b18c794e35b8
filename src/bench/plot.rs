//! The report as pictures (pure): one self-contained SVG document (no
//! scripts, fonts, styles or images from elsewhere: it opens offline, and
//! the daemon accepts it for the dashboard), or an HTML page holding it
//! and the table of figures.
//!
//! ```text
//!  title, host, legend (one colour per target)
//!  IOPS per test: grouped bars, log axis (a RAM drive and a disk differ
//!                 by orders of magnitude), the figure at each bar's end
//!  latency per test: small multiples, one line per target: x latency
//!                 (log axis), y percentile on a tail scale (0, 90, 99,
//!                 99.9, 99.99%), drawn from the report's histogram
//! ```
//!
//! Every series is a `<g class="series" data-target="NAME">` and every
//! chart a `<g class="chart" data-chart="iops|latency">` (latency charts
//! name their `data-test`), so a test (or a stylesheet) finds one series
//! per target in each chart.

use std::fmt::Write;

use super::svg::{colour, esc, n, si, tick, us_label, LogAxis};
use crate::api::wire::bench::{BenchReport, BenchResult};

const WIDTH: f64 = 960.0;
const MARGIN: f64 = 20.0;
/// IOPS chart: test labels on the left, bars from here to the right edge.
const BAR_LEFT: f64 = 200.0;
const BAR_RIGHT: f64 = WIDTH - 90.0;
const BAR_HEIGHT: f64 = 14.0;
/// Latency charts: two per row.
const LAT_W: f64 = (WIDTH - 3.0 * MARGIN) / 2.0;
const LAT_H: f64 = 230.0;
/// The tail scale's top: -log10(1 - 0.9999).
const TAIL_MAX: f64 = 4.0;

/// The report's SVG document.
pub fn svg(r: &BenchReport) -> String {
    let mut body = String::new();
    let mut y = header(&mut body, r);
    y = iops_chart(&mut body, r, y + 10.0);
    y = latency_charts(&mut body, r, y + 20.0);
    let height = y + MARGIN;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\n{body}</svg>\n",
        w = n(WIDTH),
        h = n(height)
    )
}

/// The report as an HTML page: the SVG and a table of every figure.
pub fn html(r: &BenchReport) -> String {
    let mut rows = String::new();
    for x in &r.results {
        let _ = writeln!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&x.test),
            esc(&x.target),
            si(x.iops),
            si(x.mib_s),
            us_label(x.lat_us.mean),
            us_label(x.lat_us.p50),
            us_label(x.lat_us.p99),
            us_label(x.lat_us.p99_9),
            us_label(x.lat_us.max)
        );
    }
    let mut notes = String::new();
    for t in &r.targets {
        for note in &t.notes {
            let _ = writeln!(notes, "<li>{}: {}</li>", esc(&t.name), esc(note));
        }
    }
    for s in &r.skipped {
        let _ = writeln!(
            notes,
            "<li>{} on {}: not run ({})</li>",
            esc(&s.test),
            esc(&s.target),
            esc(&s.reason)
        );
    }
    format!(
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head><meta charset=\"utf-8\"/><title>ramd bench: {title}</title>\n<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{padding:2px 10px;text-align:right}}td:nth-child(-n+2),th:nth-child(-n+2){{text-align:left}}</style></head>\n<body>\n<h1>ramd bench: {title}</h1>\n{svg}<table>\n<tr><th>test</th><th>target</th><th>IOPS</th><th>MiB/s</th><th>mean</th><th>p50</th><th>p99</th><th>p99.9</th><th>max</th></tr>\n{rows}</table>\n<ul>\n{notes}</ul>\n</body>\n</html>\n",
        title = esc(&format!("{} profile, {}", r.profile, r.started_at)),
        svg = svg(r),
    )
}

/// Title, host and legend; the y below them.
fn header(out: &mut String, r: &BenchReport) -> f64 {
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"30\" font-size=\"18\" font-weight=\"bold\">ramd bench: {} profile</text>",
        n(MARGIN),
        esc(&r.profile)
    );
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"50\" fill=\"#555555\">{} on {} ({} CPUs, Linux {}); {} s per test; {}</text>",
        n(MARGIN),
        esc(&r.started_at),
        esc(&r.host.hostname),
        r.host.cpus,
        esc(&r.host.kernel),
        si(r.runtime_s),
        esc(&r.tool)
    );
    let mut y = 75.0;
    for (i, t) in r.targets.iter().enumerate() {
        let cache = if t.page_cache { ", page cache" } else { "" };
        let direct = if t.direct_io { ", O_DIRECT" } else { "" };
        let _ = writeln!(
            out,
            "<g class=\"legend\" data-target=\"{name}\"><rect x=\"{x}\" y=\"{ry}\" width=\"12\" height=\"12\" fill=\"{c}\"/><text x=\"{tx}\" y=\"{y}\">{name} ({kind}, {engine}{direct}{cache})</text></g>",
            name = esc(&t.name),
            x = n(MARGIN),
            ry = n(y - 10.0),
            c = colour(i),
            tx = n(MARGIN + 18.0),
            y = n(y),
            kind = esc(&t.kind),
            engine = esc(&t.engine),
        );
        y += 18.0;
    }
    y
}

/// The results of `test`, in target order, with each target's index.
fn results_of<'a>(r: &'a BenchReport, test: &str) -> Vec<(usize, &'a BenchResult)> {
    r.targets
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            r.results
                .iter()
                .find(|x| x.test == test && x.target == t.name)
                .map(|x| (i, x))
        })
        .collect()
}

/// Grouped IOPS bars, one group per test that ran; the y below it.
fn iops_chart(out: &mut String, r: &BenchReport, top: f64) -> f64 {
    let axis = LogAxis::fit(r.results.iter().map(|x| x.iops), BAR_LEFT, BAR_RIGHT);
    let _ = writeln!(out, "<g class=\"chart\" data-chart=\"iops\">");
    let _ = writeln!(out, "<text x=\"{}\" y=\"{}\" font-size=\"15\" font-weight=\"bold\">IOPS per test (log scale; 1 MiB tests: MiB/s = IOPS)</text>", n(MARGIN), n(top + 14.0));
    let mut y = top + 30.0;
    let mut series: Vec<String> = vec![String::new(); r.targets.len()];
    let group_top = y;
    for test in &r.tests {
        let rs = results_of(r, &test.name);
        if rs.is_empty() {
            continue;
        }
        let h = rs.len() as f64 * (BAR_HEIGHT + 2.0);
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            n(BAR_LEFT - 8.0),
            n(y + h / 2.0 + 4.0),
            esc(&test.name)
        );
        for (k, (i, x)) in rs.iter().enumerate() {
            let by = y + k as f64 * (BAR_HEIGHT + 2.0);
            let w = (axis.pos(x.iops) - BAR_LEFT).max(1.0);
            let _ = write!(
                series[*i],
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: {} IOPS, {} MiB/s</title></rect><text x=\"{}\" y=\"{}\" font-size=\"11\">{}</text>",
                n(BAR_LEFT),
                n(by),
                n(w),
                n(BAR_HEIGHT),
                colour(*i),
                esc(&x.target),
                si(x.iops),
                si(x.mib_s),
                n(BAR_LEFT + w + 4.0),
                n(by + BAR_HEIGHT - 3.0),
                si(x.iops)
            );
        }
        y += h + 10.0;
    }
    let bottom = y;
    for (v, x) in axis.ticks() {
        let _ = writeln!(
            out,
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#dddddd\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555555\">{}</text>",
            n(group_top - 4.0),
            n(bottom),
            n(bottom + 14.0),
            tick(v),
            x = n(x)
        );
    }
    for (i, s) in series.iter().enumerate().filter(|(_, s)| !s.is_empty()) {
        let _ = writeln!(
            out,
            "<g class=\"series\" data-target=\"{}\">{s}</g>",
            esc(&r.targets[i].name)
        );
    }
    let _ = writeln!(out, "</g>");
    bottom + 20.0
}

/// `-log10(1 - p)`, the tail scale, capped at [`TAIL_MAX`].
fn tail(p: f64) -> f64 {
    (-(1.0 - p).max(1e-9).log10()).clamp(0.0, TAIL_MAX)
}

/// The latency charts, two per row; the y below them.
fn latency_charts(out: &mut String, r: &BenchReport, top: f64) -> f64 {
    let _ = writeln!(out, "<text x=\"{}\" y=\"{}\" font-size=\"15\" font-weight=\"bold\">Latency distribution per test (x: latency, log scale; y: percentile)</text>", n(MARGIN), n(top + 14.0));
    let tests: Vec<_> = r
        .tests
        .iter()
        .filter(|t| !results_of(r, &t.name).is_empty())
        .collect();
    for (k, t) in tests.iter().enumerate() {
        let x = MARGIN + (k % 2) as f64 * (LAT_W + MARGIN);
        let y = top + 30.0 + (k / 2) as f64 * (LAT_H + MARGIN);
        latency_chart(out, r, &t.name, x, y);
    }
    top + 30.0 + tests.len().div_ceil(2) as f64 * (LAT_H + MARGIN)
}

/// One test's latency distribution in the box at (x0, y0).
fn latency_chart(out: &mut String, r: &BenchReport, test: &str, x0: f64, y0: f64) {
    let rs = results_of(r, test);
    let (left, right) = (x0 + 50.0, x0 + LAT_W - 10.0);
    let (top, bottom) = (y0 + 25.0, y0 + LAT_H - 30.0);
    let axis = LogAxis::fit(
        rs.iter()
            .flat_map(|(_, x)| x.histogram_us.iter().map(|h| h[0])),
        left,
        right,
    );
    let ypos = |p: f64| bottom - tail(p) / TAIL_MAX * (bottom - top);
    let _ = writeln!(
        out,
        "<g class=\"chart\" data-chart=\"latency\" data-test=\"{}\">",
        esc(test)
    );
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999999\"/>",
        n(left),
        n(top),
        n(right - left),
        n(bottom - top)
    );
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" font-weight=\"bold\">{}</text>",
        n(x0),
        n(y0 + 15.0),
        esc(test)
    );
    for (v, x) in axis.ticks() {
        let _ = writeln!(out, "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"#e5e5e5\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\" fill=\"#555555\">{}</text>", n(top), n(bottom), n(bottom + 13.0), us_label(v), x = n(x));
    }
    for (p, label) in [
        (0.0, "0%"),
        (0.9, "90%"),
        (0.99, "99%"),
        (0.999, "99.9%"),
        (0.9999, "99.99%"),
    ] {
        let yy = ypos(p);
        let _ = writeln!(out, "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#e5e5e5\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"10\" fill=\"#555555\">{label}</text>", n(left), n(right), n(left - 4.0), n(yy + 3.0), y = n(yy));
    }
    for (i, x) in rs {
        let total: f64 = x.histogram_us.iter().map(|h| h[1]).sum();
        if total <= 0.0 {
            continue;
        }
        let mut seen = 0.0;
        let mut points = String::new();
        if let Some(first) = x.histogram_us.first() {
            let _ = write!(points, "{},{}", n(axis.pos(first[0])), n(ypos(0.0)));
        }
        for h in &x.histogram_us {
            seen += h[1];
            let _ = write!(points, " {},{}", n(axis.pos(h[0])), n(ypos(seen / total)));
        }
        let _ = writeln!(
            out,
            "<g class=\"series\" data-target=\"{name}\"><polyline points=\"{points}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"><title>{name}: p50 {p50}, p99 {p99}, p99.9 {p999}</title></polyline></g>",
            name = esc(&x.target),
            c = colour(i),
            p50 = us_label(x.lat_us.p50),
            p99 = us_label(x.lat_us.p99),
            p999 = us_label(x.lat_us.p99_9),
        );
    }
    let _ = writeln!(out, "</g>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::wire::bench::*;
    use crate::bench::latency::Recorder;
    use crate::bench::profile::find;
    use crate::bench::report;

    fn sample() -> BenchReport {
        let t = find("randread-4k-qd1").unwrap();
        let target = |name: &str| BenchTarget {
            name: name.into(),
            kind: "file".into(),
            path: "/p".into(),
            engine: "io_uring".into(),
            direct_io: true,
            page_cache: false,
            working_set_bytes: 1 << 20,
            notes: vec!["a <note>".into()],
        };
        let mut results = Vec::new();
        for (name, ns) in [("ram & <co>", 10_000u64), ("disk", 300_000)] {
            let mut rec = Recorder::default();
            for k in 0..100 {
                rec.read.record(ns + k * 100, 4096);
            }
            results.push(report::result(
                name,
                &t,
                &rec,
                std::time::Duration::from_secs(1),
            ));
        }
        BenchReport {
            version: REPORT_VERSION,
            tool: "ramd test".into(),
            profile: "quick".into(),
            started_at: "2025-01-01T00:00:00Z".into(),
            finished_at: "2025-01-01T00:00:01Z".into(),
            runtime_s: 1.0,
            host: BenchHost {
                hostname: "h".into(),
                cpus: 2,
                kernel: "6.1".into(),
            },
            targets: vec![target("ram & <co>"), target("disk")],
            tests: vec![report::test_info(&t)],
            results,
            skipped: vec![],
            comparisons: vec![],
        }
    }

    #[test]
    fn one_series_per_target_in_every_chart_and_text_escaped() {
        let s = svg(&sample());
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert_eq!(s.matches("<g class=\"chart\"").count(), 2);
        assert_eq!(s.matches("<g class=\"series\"").count(), 4);
        assert_eq!(s.matches("data-target=\"ram &amp; &lt;co&gt;\"").count(), 3);
        assert!(!s.contains("<co>"));
        // The daemon accepts it for the dashboard.
        crate::api::server::bench::check_svg(&s).unwrap();
        let h = html(&sample());
        assert!(h.starts_with("<!DOCTYPE html>") && h.contains(&s));
        assert!(h.contains("a &lt;note&gt;"));
    }

    #[test]
    fn tail_scale() {
        assert_eq!(tail(0.0), 0.0);
        assert!((tail(0.99) - 2.0).abs() < 1e-9);
        assert_eq!(tail(1.0), TAIL_MAX);
    }
}
