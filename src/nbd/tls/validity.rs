//! When a certificate is valid: its notBefore and notAfter, read from the
//! DER, and whether a moment lies between them.
//!
//! rustls checks client certificates' dates but never the server's own:
//! a server loads an expired certificate happily and then every client
//! refuses it. The daemon warns at start and refuses a reload of a
//! certificate that is not valid now (`settings.rs`).
//!
//! Pure DER walking with `identity::tlv`, as hostile-input-proof: no
//! crate in the tree exposes the dates (rustls-webpki keeps them
//! private), and an X.509 crate for two fields would bring a parser
//! stack; the two time formats are a dozen lines.
//!
//! ```text
//! tbsCertificate SEQUENCE { [0] version?, serialNumber, signature, issuer,
//!     validity SEQUENCE { notBefore Time, notAfter Time }, ... }
//! Time = UTCTime "YYMMDDHHMMSSZ" (YY < 50: 20YY, else 19YY)
//!      | GeneralizedTime "YYYYMMDDHHMMSSZ"
//! ```

use std::fmt;

use super::identity::tlv;

const SEQUENCE: u8 = 0x30;
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// A moment of a certificate: seconds since the Unix epoch (negative
/// before 1970), shown as `YYYY-MM-DD HH:MM:SS UTC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub i64);

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.0.div_euclid(86_400);
        let secs = self.0.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(
            f,
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        )
    }
}

/// A certificate's validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: Time,
    pub not_after: Time,
}

/// Why a certificate cannot be used at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfDate {
    /// Its notBefore is later.
    NotYetValid,
    /// Its notAfter is earlier.
    Expired,
}

impl Validity {
    /// None when `now` lies within the period (both ends included, as
    /// RFC 5280 says).
    pub fn check(&self, now: Time) -> Option<OutOfDate> {
        if now < self.not_before {
            Some(OutOfDate::NotYetValid)
        } else if now > self.not_after {
            Some(OutOfDate::Expired)
        } else {
            None
        }
    }
}

/// The current time, as a certificate counts it.
pub fn now() -> Time {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Time(i64::try_from(since).unwrap_or(i64::MAX))
}

/// The validity of a DER certificate; None when it is not one.
pub fn of_certificate(der: &[u8]) -> Option<Validity> {
    let (SEQUENCE, cert, _) = tlv(der)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = tlv(cert)? else {
        return None;
    };
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serialNumber, signature, issuer.
    for _ in 0..3 {
        tbs = tlv(tbs)?.2;
    }
    let (SEQUENCE, validity, _) = tlv(tbs)? else {
        return None;
    };
    let (tag, before, rest) = tlv(validity)?;
    let not_before = time(tag, before)?;
    let (tag, after, _) = tlv(rest)?;
    let not_after = time(tag, after)?;
    Some(Validity {
        not_before,
        not_after,
    })
}

/// A UTCTime or GeneralizedTime in the form RFC 5280 requires (UTC, `Z`,
/// with seconds, no fraction).
fn time(tag: u8, text: &[u8]) -> Option<Time> {
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(&text[..2])?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &text[2..])
        }
        (GENERALIZED_TIME, 15) => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let [month, day, hour, minute, second] =
        [0, 2, 4, 6, 8].map(|i| digits(&rest[i..i + 2]).unwrap_or(99));
    if !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(Time(days * 86_400 + hour * 3600 + minute * 60 + second))
}

/// ASCII digits as a number.
fn digits(text: &[u8]) -> Option<i64> {
    text.iter().try_fold(0i64, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
    })
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::super::identity::der;
    use super::*;

    fn cert(before: (u8, &str), after: (u8, &str)) -> Vec<u8> {
        let validity = der(
            SEQUENCE,
            &[
                der(before.0, before.1.as_bytes()),
                der(after.0, after.1.as_bytes()),
            ]
            .concat(),
        );
        let tbs = der(
            SEQUENCE,
            &[
                der(VERSION, &der(0x02, &[2])),
                der(0x02, &[1]),
                der(SEQUENCE, &der(0x06, &[1, 2])),
                der(SEQUENCE, &[]),
                validity,
                der(SEQUENCE, &[]),
            ]
            .concat(),
        );
        der(
            SEQUENCE,
            &[tbs, der(SEQUENCE, &[]), der(0x03, &[0])].concat(),
        )
    }

    #[test]
    fn both_time_forms_are_read_and_shown() {
        let c = cert(
            (UTC_TIME, "200229123456Z"),
            (GENERALIZED_TIME, "20991231235959Z"),
        );
        let v = of_certificate(&c).unwrap();
        assert_eq!(v.not_before.to_string(), "2020-02-29 12:34:56 UTC");
        assert_eq!(v.not_after.to_string(), "2099-12-31 23:59:59 UTC");
        assert_eq!(v.not_before, Time(1_582_979_696));
        // UTCTime 50..99 is the 1900s.
        let c = cert((UTC_TIME, "500101000000Z"), (UTC_TIME, "491231235959Z"));
        let v = of_certificate(&c).unwrap();
        assert_eq!(v.not_before.to_string(), "1950-01-01 00:00:00 UTC");
        assert!(v.not_before.0 < 0);
        assert_eq!(v.not_after.to_string(), "2049-12-31 23:59:59 UTC");
    }

    #[test]
    fn a_moment_is_checked_against_both_ends() {
        let v = Validity {
            not_before: Time(100),
            not_after: Time(200),
        };
        assert_eq!(v.check(Time(99)), Some(OutOfDate::NotYetValid));
        assert_eq!(v.check(Time(100)), None);
        assert_eq!(v.check(Time(200)), None);
        assert_eq!(v.check(Time(201)), Some(OutOfDate::Expired));
        assert!(now() > Time(1_700_000_000));
    }

    #[test]
    fn malformed_times_and_truncations_give_none() {
        for bad in [
            (UTC_TIME, "200230000000Z"),         // 30 February
            (UTC_TIME, "201301000000Z"),         // month 13
            (UTC_TIME, "200101240000Z"),         // hour 24
            (UTC_TIME, "2001010000000"),         // no Z
            (UTC_TIME, "2001010000Z"),           // no seconds
            (GENERALIZED_TIME, "200101000000Z"), // too short
            (UTC_TIME, "20010100000aZ"),
            (0x04, "200101000000Z"),
        ] {
            let c = cert(bad, (UTC_TIME, "300101000000Z"));
            assert_eq!(of_certificate(&c), None, "{bad:?}");
        }
        let good = cert((UTC_TIME, "200101000000Z"), (UTC_TIME, "300101000000Z"));
        assert!(of_certificate(&good).is_some());
        for n in 0..good.len() {
            assert_eq!(of_certificate(&good[..n]), None, "cut at {n}");
        }
        for i in 0..good.len() {
            for b in [0x00, 0x7f, 0x80, 0x84, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = of_certificate(&bad);
            }
        }
    }

    #[test]
    fn days_round_trip_across_leap_years_and_eras() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }
}
