//! A client's identity from its certificate: the subject's common name
//! (CN), else the first subject alternative name (DNS name, email or URI).
//!
//! Pure DER walking over a certificate rustls has already verified (so it
//! is well-formed), but written as if it were hostile all the same: every
//! length is checked against what is left and anything unexpected gives
//! `None`, never a panic. Only the few fields on the way are read:
//!
//! ```text
//! Certificate  SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
//! tbsCertificate SEQUENCE {
//!     [0] version (optional)   serialNumber   signature   issuer   validity
//!     subject Name             subjectPublicKeyInfo
//!     [1] issuerUID, [2] subjectUID (optional)
//!     [3] extensions SEQUENCE OF { extnID, critical?, extnValue OCTET STRING }
//! }
//! Name = SEQUENCE OF SET OF SEQUENCE { type OID, value string }
//! subjectAltName (2.5.29.17) = SEQUENCE OF GeneralName
//!     [1] rfc822Name  [2] dNSName  [6] uniformResourceIdentifier (IA5 strings)
//! ```

/// Names longer than this are cut (with no effect on verification): they
/// go into log lines.
const MAX_IDENTITY_BYTES: usize = 256;

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const OCTET_STRING: u8 = 0x04;
const VERSION: u8 = 0xa0;
const EXTENSIONS: u8 = 0xa3;
/// 2.5.4.3, commonName.
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
/// 2.5.29.17, subjectAltName.
const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];
/// GeneralName tags (context-specific, primitive) whose value is text.
const SAN_EMAIL: u8 = 0x81;
const SAN_DNS: u8 = 0x82;
const SAN_URI: u8 = 0x86;

/// The identity in a DER certificate: CN, else the first textual SAN.
pub fn of_certificate(der: &[u8]) -> Option<String> {
    let (tag, cert, _) = tlv(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, mut tbs, _) = tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    if tbs.first() == Some(&VERSION) {
        tbs = tlv(tbs)?.2;
    }
    // serialNumber, signature, issuer, validity.
    for _ in 0..4 {
        tbs = tlv(tbs)?.2;
    }
    let (tag, subject, rest) = tlv(tbs)?;
    if tag != SEQUENCE {
        return None;
    }
    if let Some(cn) = common_name(subject) {
        return Some(cn);
    }
    let mut rest = tlv(rest)?.2; // subjectPublicKeyInfo
    while let Some((tag, value, after)) = tlv(rest) {
        if tag == EXTENSIONS {
            return first_alt_name(value);
        }
        rest = after;
    }
    None
}

/// The first CN in a Name.
fn common_name(mut name: &[u8]) -> Option<String> {
    while let Some((SET, mut set, rest)) = tlv(name) {
        while let Some((SEQUENCE, attribute, after)) = tlv(set) {
            let (tag, oid, value) = tlv(attribute)?;
            if tag == OID && oid == OID_CN {
                return text(tlv(value)?.1);
            }
            set = after;
        }
        name = rest;
    }
    None
}

/// The first email, DNS or URI name of the subjectAltName extension in
/// `[3] { SEQUENCE OF Extension }`.
fn first_alt_name(explicit: &[u8]) -> Option<String> {
    let (SEQUENCE, mut extensions, _) = tlv(explicit)? else {
        return None;
    };
    while let Some((tag, extension, rest)) = tlv(extensions) {
        extensions = rest;
        if tag != SEQUENCE {
            continue;
        }
        let (OID, oid, mut fields) = tlv(extension)? else {
            continue;
        };
        if oid != OID_SAN {
            continue;
        }
        // Skip `critical` if present; the value is the OCTET STRING.
        while let Some((tag, value, after)) = tlv(fields) {
            if tag == OCTET_STRING {
                let (SEQUENCE, mut names, _) = tlv(value)? else {
                    return None;
                };
                while let Some((tag, name, after)) = tlv(names) {
                    if matches!(tag, SAN_EMAIL | SAN_DNS | SAN_URI) {
                        return text(name);
                    }
                    names = after;
                }
                return None;
            }
            fields = after;
        }
    }
    None
}

/// Printable text for a log line: UTF-8 (Printable, IA5 and UTF8 strings
/// all are), control characters replaced, cut at `MAX_IDENTITY_BYTES`.
fn text(bytes: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(bytes).ok()?;
    let clean: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .scan(0usize, |len, c| {
            *len += c.len_utf8();
            (*len <= MAX_IDENTITY_BYTES).then_some(c)
        })
        .collect();
    (!clean.is_empty()).then_some(clean)
}

/// One DER element of `value` under `tag` (lengths up to 64 KiB): the
/// tests' way to build certificates field by field.
#[cfg(test)]
pub(super) fn der(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    if value.len() < 0x80 {
        out.push(value.len() as u8);
    } else {
        out.extend_from_slice(&[0x82, (value.len() >> 8) as u8, value.len() as u8]);
    }
    out.extend_from_slice(value);
    out
}

/// One DER element: (tag, contents, what follows). Single-byte tags only
/// (all X.509 needs); lengths in short or long form up to 4 bytes.
pub(super) fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let count = (first & 0x7f) as usize;
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | b as usize)
    };
    if rest.len() < len {
        return None;
    }
    let (value, after) = rest.split_at(len);
    Some((tag, value, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.concat()
    }

    fn name(cn: Option<&str>) -> Vec<u8> {
        let org = der(
            SET,
            &der(
                SEQUENCE,
                &cat(&[der(OID, &[0x55, 0x04, 0x0a]), der(0x0c, b"ramd")]),
            ),
        );
        let mut parts = vec![org];
        if let Some(cn) = cn {
            parts.push(der(
                SET,
                &der(
                    SEQUENCE,
                    &cat(&[der(OID, OID_CN), der(0x0c, cn.as_bytes())]),
                ),
            ));
        }
        der(SEQUENCE, &cat(&parts))
    }

    fn cert(cn: Option<&str>, san: Option<(u8, &str)>) -> Vec<u8> {
        let mut tbs = vec![
            der(VERSION, &der(0x02, &[2])),
            der(0x02, &[1]),
            der(SEQUENCE, &der(OID, &[1, 2])),
            name(Some("issuer")),
            der(SEQUENCE, &[]),
            name(cn),
            der(SEQUENCE, &der(0x03, &[0, 1, 2])),
        ];
        if let Some((tag, value)) = san {
            let names = der(SEQUENCE, &der(tag, value.as_bytes()));
            let basic = der(
                SEQUENCE,
                &cat(&[der(OID, &[0x55, 0x1d, 0x13]), der(OCTET_STRING, &[0x30, 0])]),
            );
            let alt = der(
                SEQUENCE,
                &cat(&[
                    der(OID, OID_SAN),
                    der(0x01, &[0xff]),
                    der(OCTET_STRING, &names),
                ]),
            );
            tbs.push(der(EXTENSIONS, &der(SEQUENCE, &cat(&[basic, alt]))));
        }
        let tbs = der(SEQUENCE, &cat(&tbs));
        der(SEQUENCE, &cat(&[tbs, der(SEQUENCE, &[]), der(0x03, &[0])]))
    }

    #[test]
    fn common_name_first_then_alt_name() {
        assert_eq!(
            of_certificate(&cert(Some("client-a"), Some((SAN_DNS, "a.example")))),
            Some("client-a".into())
        );
        assert_eq!(
            of_certificate(&cert(None, Some((SAN_DNS, "a.example")))),
            Some("a.example".into())
        );
        assert_eq!(
            of_certificate(&cert(None, Some((SAN_EMAIL, "ops@example.org")))),
            Some("ops@example.org".into())
        );
        assert_eq!(of_certificate(&cert(None, None)), None);
        // An IP address SAN is not text: no identity from it.
        assert_eq!(
            of_certificate(&cert(None, Some((0x87, "\x7f\0\0\x01")))),
            None
        );
    }

    #[test]
    fn long_and_control_characters_are_made_safe_for_logs() {
        let long = "x".repeat(1000);
        let got = of_certificate(&cert(Some(&long), None)).unwrap();
        assert_eq!(got.len(), MAX_IDENTITY_BYTES);
        let got = of_certificate(&cert(Some("a\nb"), None)).unwrap();
        assert_eq!(got, "a?b");
    }

    /// Every truncation and every single-byte corruption of a certificate
    /// gives some answer without panicking.
    #[test]
    fn malformed_input_never_panics() {
        let good = cert(Some("client"), Some((SAN_DNS, "c.example")));
        for n in 0..good.len() {
            let _ = of_certificate(&good[..n]);
        }
        for i in 0..good.len() {
            for b in [0x00, 0x7f, 0x80, 0x84, 0x85, 0xff] {
                let mut bad = good.clone();
                bad[i] = b;
                let _ = of_certificate(&bad);
            }
        }
        assert_eq!(tlv(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(tlv(&[0x30, 0x80]), None);
    }
}
