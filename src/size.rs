//! Human sizes: parsing `512`, `4K`, `4KiB`, `1.5G`, `2GiB` (binary units)
//! and printing bytes back as `1.5 GiB`. Whitespace around the number and
//! between number and unit is allowed, so what [`format_size`] prints
//! parses back; whitespace inside the number is not (`1 000G`).

/// Why a text is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size: expected a number with an optional unit, like 4G")]
    Empty,
    /// The unit (lowercased) is none of B, K, M, G, T, P.
    #[error("unknown size unit '{unit}' in '{text}': use B, K, M, G, T or P (binary, e.g. 512, 4K, 1.5G, 2GiB)")]
    UnknownUnit { unit: String, text: String },
    /// The number does not parse.
    #[error("'{0}' is not a size: expected a number with an optional unit, like 512, 4K, 1.5G")]
    NotANumber(String),
    /// A fraction that does not come out to whole bytes.
    #[error("'{0}' is not a whole number of bytes")]
    NotWholeBytes(String),
    /// More than `u64::MAX` bytes.
    #[error("'{0}' is too large")]
    TooLarge(String),
}

/// Parses a size. Units are binary (K = KiB = 1024). Fractions are allowed
/// with a unit and must come out to a whole number of bytes.
pub fn parse(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = unit_shift(unit).ok_or_else(|| SizeError::UnknownUnit {
        unit: unit.trim().to_ascii_lowercase(),
        text: t.to_owned(),
    })?;
    let bad = || SizeError::NotANumber(t.to_owned());
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| bad())?
    };
    let mut bytes = int << shift;
    if !frac_part.is_empty() {
        let digits = frac_part.len() as u32;
        if digits > 18 {
            return Err(bad());
        }
        let frac: u128 = frac_part.parse().map_err(|_| bad())?;
        let scale = 10u128.pow(digits);
        let frac_bytes = frac << shift;
        if frac_bytes % scale != 0 {
            return Err(SizeError::NotWholeBytes(t.to_owned()));
        }
        bytes += frac_bytes / scale;
    }
    u64::try_from(bytes).map_err(|_| SizeError::TooLarge(t.to_owned()))
}

/// The power of two a unit stands for (`K` 10, `GiB` 30); None when unknown.
fn unit_shift(unit: &str) -> Option<u32> {
    Some(match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "ki" | "kib" => 10,
        "m" | "mb" | "mi" | "mib" => 20,
        "g" | "gb" | "gi" | "gib" => 30,
        "t" | "tb" | "ti" | "tib" => 40,
        "p" | "pb" | "pi" | "pib" => 50,
        _ => return None,
    })
}

/// Formats bytes with a binary unit: `0 B`, `512 B`, `4 KiB`, `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        let num = format!("{value:.2}");
        let num = num.trim_end_matches('0').trim_end_matches('.');
        format!("{num} {}", UNITS[unit])
    }
}

/// A size written in a config file as `"4G"` or as a number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> serde::Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size like \"4G\", \"512M\", \"1.5GiB\" or a number of bytes")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                parse(v).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("512").unwrap(), 512);
        assert_eq!(parse("4K").unwrap(), 4096);
        assert_eq!(parse("4KiB").unwrap(), 4096);
        assert_eq!(parse("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse(" 1m ").unwrap(), 1 << 20);
        // kubectl's and Docker's spellings too.
        assert_eq!(parse("4Gi").unwrap(), 4 << 30);
        assert_eq!(parse("512Mi").unwrap(), 512 << 20);
        assert_eq!(parse("8ki").unwrap(), 8 << 10);
    }

    #[test]
    fn a_space_may_separate_number_and_unit() {
        // What format_size prints parses back (docs/config.md, api.md).
        assert_eq!(parse("1 G").unwrap(), 1 << 30);
        assert_eq!(parse(" 1.5 GiB ").unwrap(), 3 << 29);
        for bytes in [4096, 3 << 29, 1 << 30, 512] {
            assert_eq!(parse(&format_size(bytes)).unwrap(), bytes);
        }
        for bad in ["1 000G", "1 0", "1 G B"] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "12Q",
            "G",
            "1.2.3K",
            "-1",
            "1.0000001K",
            "99999999999P",
            "0x10",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size(1 << 30), "1 GiB");
    }
}
