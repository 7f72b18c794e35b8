//! A snapshot's label where a listing can read it: in the user metadata
//! of its manifest object (`x-amz-meta-ramd-label`).
//!
//! Why there: the manifest holds the label too (restore reads it there,
//! verified with the rest), but a listing would then have to download
//! every manifest (a 1 TiB drive's is 132 MiB) to print one line each.
//! Metadata comes back with a HEAD, so `snapshot list` costs one small
//! request per snapshot, run several at once.
//!
//! The value is `p:` and the label's UTF-8 in URL-safe base64 for a plain
//! snapshot, or `e:` and the label sealed with the snapshot's keys (the
//! codec's envelope, named after the manifest plus `#label`, so it opens
//! only as that snapshot's label) for an encrypted one: the label of an
//! encrypted snapshot leaves the host no more in plaintext than its data.
//! Base64, because metadata travels in HTTP headers (ASCII only). An empty
//! label writes no metadata. Snapshots pushed before labels were kept
//! there, and sealed labels read without the key, list without a label.
//!
//! A plain label in metadata is not verified the way the manifest is:
//! listings show what the bucket says (a sealed one is authenticated by
//! its tag).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use futures::{StreamExt, TryStreamExt};

use super::codec::{self, Keys};
use super::error::SnapshotError;
use super::manifest::{SnapshotId, MAX_TEXT_BYTES};
use super::remote::Remote;

/// The metadata key (`x-amz-meta-ramd-label` on S3).
pub const METADATA_KEY: &str = "ramd-label";

/// HEADs in flight while labels are read for a listing.
const LISTING_CONCURRENCY: usize = 16;

/// The name a sealed label is bound to.
fn sealed_name(manifest_name: &str) -> String {
    format!("{manifest_name}#label")
}

/// The metadata value of `label` for the manifest `manifest_name`; None
/// for an empty label.
pub fn encode(manifest_name: &str, label: &str, keys: Option<&Keys>) -> Option<String> {
    if label.is_empty() {
        return None;
    }
    Some(match keys {
        None => format!("p:{}", URL_SAFE_NO_PAD.encode(label)),
        Some(k) => {
            let sealed = codec::encode(&sealed_name(manifest_name), label.as_bytes(), Some(k));
            format!("e:{}", URL_SAFE_NO_PAD.encode(sealed))
        }
    })
}

/// The label a metadata value holds; None when it does not decode, or is
/// sealed and `keys` cannot open it.
pub fn decode(manifest_name: &str, value: &str, keys: Option<&Keys>) -> Option<String> {
    let (kind, body) = value.split_once(':')?;
    let bytes = URL_SAFE_NO_PAD.decode(body).ok()?;
    let plain = match kind {
        "p" => bytes,
        "e" => codec::decode(
            &sealed_name(manifest_name),
            &bytes,
            Some(keys?),
            MAX_TEXT_BYTES as u64,
        )
        .ok()?,
        _ => return None,
    };
    String::from_utf8(plain).ok()
}

/// The labels of `ids` on `remote`, in order (None: no label, or none
/// that can be read; a snapshot deleted meanwhile has none).
pub async fn labels(
    remote: &Remote,
    ids: &[SnapshotId],
    keys: Option<&Keys>,
) -> Result<Vec<Option<String>>, SnapshotError> {
    // Owned names: a closure over `&SnapshotId` would make the future
    // generic over that lifetime, which axum's handlers cannot take.
    let names: Vec<String> = ids.iter().map(SnapshotId::object_name).collect();
    futures::stream::iter(names)
        .map(|name| async move {
            let meta = remote.metadata(&name).await?;
            let value = meta.as_ref().and_then(|m| m.get(METADATA_KEY));
            Ok::<_, SnapshotError>(value.and_then(|v| decode(&name, v, keys)))
        })
        .buffered(LISTING_CONCURRENCY)
        .try_collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_labels_round_trip_as_ascii() {
        let v = encode("snapshots/db/1-2", "before upgrade: ü\n", None).unwrap();
        assert!(v.starts_with("p:") && v.is_ascii(), "{v}");
        assert_eq!(
            decode("snapshots/db/1-2", &v, None).as_deref(),
            Some("before upgrade: ü\n")
        );
        assert_eq!(encode("snapshots/db/1-2", "", None), None);
        assert_eq!(decode("x", "garbage", None), None);
        assert_eq!(decode("x", "q:AAAA", None), None);
    }

    /// A push keeps its label in the manifest object's metadata, sealed
    /// when encrypted; a listing reads it back in order, without it for
    /// an unlabelled snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pushes_keep_their_labels_where_listings_read_them() {
        use super::super::push::{push, BufferSource, PushOptions};
        use std::sync::Arc;
        let remote = Remote::from_store(Arc::new(object_store::memory::InMemory::new()), "mem");
        let keys = Arc::new(Keys::from_secret(&[7u8; 32]));
        let mut ids = Vec::new();
        for (label, k) in [
            ("before upgrade", None),
            ("", None),
            ("sealed", Some(keys.clone())),
        ] {
            let opts = PushOptions {
                label: label.into(),
                keys: k,
                ..PushOptions::new("db")
            };
            let data = vec![5u8; 1 << 20];
            let mut src = BufferSource(&data);
            let rep = push(&remote, &mut src, &opts, &mut |_: &_| {})
                .await
                .unwrap();
            ids.push(rep.id.unwrap());
        }
        let got = labels(&remote, &ids, Some(&keys)).await.unwrap();
        assert_eq!(
            got,
            [
                Some("before upgrade".to_owned()),
                None,
                Some("sealed".to_owned())
            ]
        );
        let meta = remote
            .metadata(&ids[2].object_name())
            .await
            .unwrap()
            .unwrap();
        assert!(meta[METADATA_KEY].starts_with("e:"), "{meta:?}");
        let without_key = labels(&remote, &ids, None).await.unwrap();
        assert_eq!(without_key[2], None);
    }

    #[test]
    fn sealed_labels_open_only_with_the_key_and_for_their_snapshot() {
        let keys = Keys::from_secret(&[7u8; 32]);
        let v = encode("snapshots/db/1-2", "secret plans", Some(&keys)).unwrap();
        assert!(v.starts_with("e:") && v.is_ascii(), "{v}");
        let raw = URL_SAFE_NO_PAD.decode(&v[2..]).unwrap();
        assert!(!raw.windows(6).any(|w| w == b"secret"), "sealed: {raw:?}");
        assert_eq!(
            decode("snapshots/db/1-2", &v, Some(&keys)).as_deref(),
            Some("secret plans")
        );
        assert_eq!(decode("snapshots/db/1-2", &v, None), None);
        assert_eq!(decode("snapshots/db/9-9", &v, Some(&keys)), None);
        let other = Keys::from_secret(&[8u8; 32]);
        assert_eq!(decode("snapshots/db/1-2", &v, Some(&other)), None);
    }
}
