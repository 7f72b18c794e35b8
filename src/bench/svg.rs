//! Small SVG helpers (pure): escaping, numbers, log axes, a palette.
//!
//! The plots are a few hundred elements of hand-written markup: a plotting
//! crate (plotters and its SVG backend) would add a font stack and a
//! dependency tree for bars and polylines, and its output carries no
//! per-series markup a test or a stylesheet can find. Every text goes
//! through [`esc`], so a target named `<x & y>` cannot break the document
//! (or inject markup into the dashboard that shows it).

use std::fmt::Write;

/// Okabe-Ito: distinguishable with every common colour blindness.
pub const PALETTE: [&str; 8] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442",
];

/// The colour of series `i`.
pub fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Text escaped for element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // XML 1.0 has no other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A coordinate with one decimal.
pub fn n(v: f64) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:.1}", if v.is_finite() { v } else { 0.0 });
    s
}

/// A figure as people read it: `980`, `12.3k`, `1.20M`, `3.4`, `0.56`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A base-10 logarithmic axis over whole decades, mapped onto
/// `[from, to]` pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogAxis {
    lo_exp: i32,
    hi_exp: i32,
    from: f64,
    to: f64,
}

impl LogAxis {
    /// The decades around every positive value of `values` (one decade
    /// when there is none).
    pub fn fit(values: impl IntoIterator<Item = f64>, from: f64, to: f64) -> LogAxis {
        let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
        for v in values.into_iter().filter(|v| *v > 0.0 && v.is_finite()) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if hi == 0.0 {
            (lo, hi) = (1.0, 10.0);
        }
        let lo_exp = lo.log10().floor() as i32;
        let hi_exp = (hi.log10().ceil() as i32).max(lo_exp + 1);
        LogAxis {
            lo_exp,
            hi_exp,
            from,
            to,
        }
    }

    /// The pixel of `v` (values outside the axis are clamped to it).
    pub fn pos(&self, v: f64) -> f64 {
        let lv = if v > 0.0 {
            v.log10()
        } else {
            f64::from(self.lo_exp)
        };
        let f = (lv - f64::from(self.lo_exp)) / f64::from(self.hi_exp - self.lo_exp);
        self.from + f.clamp(0.0, 1.0) * (self.to - self.from)
    }

    /// Every decade: `(value, pixel)`.
    pub fn ticks(&self) -> Vec<(f64, f64)> {
        (self.lo_exp..=self.hi_exp)
            .map(|e| {
                let v = 10f64.powi(e);
                (v, self.pos(v))
            })
            .collect()
    }
}

/// A latency in microseconds as people read it: `850µs`, `12.3ms`, `1.5s`
/// (`10µs`, `1ms`: no `.0`).
pub fn us_label(us: f64) -> String {
    let (v, unit) = if us >= 1e6 {
        (us / 1e6, "s")
    } else if us >= 1e3 {
        (us / 1e3, "ms")
    } else {
        (us, "µs")
    };
    format!("{}{unit}", si(v).trim_end_matches(".0"))
}

/// A decade tick: `100`, `10k`, `1M` (no `.0`).
pub fn tick(v: f64) -> String {
    si(v)
        .replace(".0k", "k")
        .replace(".00M", "M")
        .replace(".00G", "G")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_numbers() {
        assert_eq!(esc(r#"<a & "b">'"#), "&lt;a &amp; &quot;b&quot;&gt;&#39;");
        assert_eq!(esc("a\u{1}b"), "a b");
        assert_eq!(si(123_456.0), "123.5k");
        assert_eq!(si(1_234_567.0), "1.23M");
        assert_eq!(si(512.0), "512");
        assert_eq!(si(12.34), "12.3");
        assert_eq!(si(0.5), "0.50");
        assert_eq!(n(f64::NAN), "0.0");
        assert_eq!(us_label(1000.0), "1ms");
        assert_eq!(us_label(10.0), "10µs");
        assert_eq!(us_label(1500.0), "1.5ms");
        assert_eq!(tick(10_000.0), "10k");
        assert_eq!(tick(1e6), "1M");
        assert_eq!(tick(100.0), "100");
    }

    #[test]
    fn log_axes_cover_whole_decades() {
        let a = LogAxis::fit([15.0, 3_000.0], 0.0, 300.0);
        let t = a.ticks();
        assert_eq!(t.first().unwrap().0, 10.0);
        assert_eq!(t.last().unwrap().0, 10_000.0);
        assert_eq!(a.pos(10.0), 0.0);
        assert_eq!(a.pos(10_000.0), 300.0);
        assert!((a.pos(100.0) - 100.0).abs() < 1e-9);
        assert_eq!(a.pos(0.0), 0.0);
        let empty = LogAxis::fit([], 0.0, 10.0);
        assert_eq!(empty.ticks().len(), 2);
        let one = LogAxis::fit([100.0], 0.0, 10.0);
        assert_eq!(one.ticks().len(), 2);
    }
}
