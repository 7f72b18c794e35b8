//! Why a private key cannot be used, in words a user can act on.
//!
//! rustls (with ring) answers an unusable key with "failed to parse
//! private key as RSA, ECDSA, or EdDSA" whatever the cause. The common
//! cause is an RSA key of a size ring does not take: ring signs with RSA
//! keys of 2048, 3072 or 4096 bits only (each prime a multiple of 512
//! bits), so a 2432-bit key (the NBD reference tester's own) parses as a
//! PEM file and is still refused. This module checks the key the way the
//! server will use it and, when it is refused, reads the RSA modulus size
//! from the DER (PKCS#1, or PKCS#8 holding PKCS#1) to say so.
//!
//! Pure code over bytes: a minimal DER walk (tag, length, contents), no
//! ASN.1 crate for the two fields it needs.

use rustls::pki_types::PrivateKeyDer;

/// The sizes ring signs with.
const RSA_BITS_TAKEN: [u32; 3] = [2048, 3072, 4096];

/// None when `key` can sign TLS handshakes; else why not, and what to do.
pub fn unusable(key: &PrivateKeyDer<'_>) -> Option<String> {
    if rustls::crypto::ring::sign::any_supported_type(key).is_ok() {
        return None;
    }
    let remedy = "make a new key, e.g. `openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:3072` \
                  or `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`, and a certificate for it";
    Some(match rsa_modulus_bits(key) {
        Some(bits) if !RSA_BITS_TAKEN.contains(&bits) => format!(
            "it is a {bits}-bit RSA key, and ramd's TLS library (rustls with ring) takes RSA keys of 2048, 3072 or 4096 bits only: {remedy}"
        ),
        Some(bits) => format!("its {bits}-bit RSA key is malformed (ring rejected it): {remedy}"),
        None => format!(
            "it is not a key ramd's TLS library can use (RSA of 2048, 3072 or 4096 bits, ECDSA on P-256 or P-384, or Ed25519): {remedy}"
        ),
    })
}

/// The bit length of an RSA key's modulus, when `key` is an RSA key.
fn rsa_modulus_bits(key: &PrivateKeyDer<'_>) -> Option<u32> {
    match key {
        PrivateKeyDer::Pkcs1(k) => pkcs1_modulus_bits(k.secret_pkcs1_der()),
        PrivateKeyDer::Pkcs8(k) => pkcs8_rsa(k.secret_pkcs8_der()).and_then(pkcs1_modulus_bits),
        _ => None,
    }
}

/// rsaEncryption, 1.2.840.113549.1.1.1, as DER contents.
const RSA_ENCRYPTION_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;

/// PKCS#8 `PrivateKeyInfo { version, AlgorithmIdentifier { rsaEncryption,
/// .. }, OCTET STRING privateKey }`: the inner PKCS#1 key.
fn pkcs8_rsa(der: &[u8]) -> Option<&[u8]> {
    let (info, _) = element(der, SEQUENCE)?;
    let (_version, rest) = element(info, INTEGER)?;
    let (algorithm, rest) = element(rest, SEQUENCE)?;
    let (oid, _) = element(algorithm, OID)?;
    if oid != RSA_ENCRYPTION_OID {
        return None;
    }
    element(rest, OCTET_STRING).map(|(key, _)| key)
}

/// PKCS#1 `RSAPrivateKey { version, modulus, .. }`: the modulus's bits.
fn pkcs1_modulus_bits(der: &[u8]) -> Option<u32> {
    let (key, _) = element(der, SEQUENCE)?;
    let (_version, rest) = element(key, INTEGER)?;
    let (modulus, _) = element(rest, INTEGER)?;
    // A positive INTEGER may carry a leading zero byte.
    let digits = match modulus.iter().position(|&b| b != 0) {
        Some(i) => &modulus[i..],
        None => return Some(0),
    };
    Some(digits.len() as u32 * 8 - digits[0].leading_zeros())
}

/// The contents of the DER element at the start of `der` if its tag is
/// `tag`, and what follows it.
fn element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = der.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{PrivatePkcs1KeyDer, PrivatePkcs8KeyDer};

    /// A DER element: tag, definite length, contents.
    fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match contents.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(contents);
        out
    }

    /// A PKCS#1 structure whose modulus has `bits` bits (not a real key:
    /// only the fields read here).
    fn pkcs1(bits: usize) -> Vec<u8> {
        let mut modulus = vec![0u8; bits.div_ceil(8) + 1];
        modulus[1] = 0x80 >> ((8 - bits % 8) % 8);
        let mut body = der(INTEGER, &[0]);
        body.extend(der(INTEGER, &modulus));
        body.extend(der(INTEGER, &[1, 0, 1]));
        der(SEQUENCE, &body)
    }

    #[test]
    fn the_modulus_size_is_read_from_pkcs1_and_pkcs8() {
        for bits in [2048, 2432, 1024, 3071] {
            let k1 = PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(pkcs1(bits)));
            assert_eq!(rsa_modulus_bits(&k1), Some(bits as u32));
            let mut alg = der(OID, RSA_ENCRYPTION_OID);
            alg.extend(der(0x05, &[]));
            let mut info = der(INTEGER, &[0]);
            info.extend(der(SEQUENCE, &alg));
            info.extend(der(OCTET_STRING, &pkcs1(bits)));
            let k8 = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der(SEQUENCE, &info)));
            assert_eq!(rsa_modulus_bits(&k8), Some(bits as u32));
        }
    }

    #[test]
    fn an_odd_sized_rsa_key_is_named_with_its_size_and_the_sizes_taken() {
        let k = PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(pkcs1(2432)));
        let why = unusable(&k).expect("refused");
        assert!(why.contains("2432-bit RSA key"), "{why}");
        assert!(why.contains("2048, 3072 or 4096"), "{why}");
        assert!(why.contains("openssl genpkey"), "{why}");
    }

    #[test]
    fn truncated_or_foreign_der_is_not_an_rsa_size() {
        let whole = pkcs1(2048);
        for cut in 0..whole.len() {
            let k = PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(whole[..cut].to_vec()));
            assert_eq!(rsa_modulus_bits(&k), None, "cut at {cut}");
        }
        let k = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der(SEQUENCE, &der(INTEGER, &[0]))));
        assert!(unusable(&k).unwrap().contains("not a key"));
    }
}
