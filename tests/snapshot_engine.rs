//! The snapshot engine (src/snapshot) against a real S3 server: a
//! single-node Garage on loopback (tests/common/garage.rs). Round trips,
//! incremental pushes, corruption, wrong credentials, a missing bucket, a
//! server that goes down mid-way, an interrupted push that resumes, and
//! GC after retention.

mod common;

use std::sync::Arc;

use common::garage::Garage;
use common::random_bytes;
use ramd::snapshot::gc::{gc, GcOptions, Retention};
use ramd::snapshot::remote::{Credentials, Remote, RemoteConfig, RemoteError};
use ramd::snapshot::{
    list_snapshots, push, restore, BufferSink, BufferSource, ChunkSource, Keys, Progress,
    PushOptions, PushReport, RestoreOptions, SnapshotError, SnapshotId,
};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

fn config(g: &Garage, bucket: &str) -> RemoteConfig {
    let mut c = RemoteConfig::new(format!("s3://{bucket}/tests").parse().unwrap());
    c.endpoint = Some(g.endpoint.clone());
    c.region = Some(g.region.clone());
    // A downed server must fail the test quickly, not after minutes.
    c.max_retries = 2;
    c.retry_timeout_ms = 3_000;
    c.connect_timeout_ms = 2_000;
    c
}

fn creds(g: &Garage) -> Credentials {
    Credentials {
        access_key_id: g.key_id.clone(),
        secret_access_key: g.secret.clone(),
        region: None,
    }
}

fn remote(g: &Garage) -> Remote {
    Remote::open(&config(g, &g.bucket), &creds(g)).unwrap()
}

fn opts(drive: &str, chunk_bytes: u64) -> PushOptions {
    PushOptions {
        chunk_bytes,
        ..PushOptions::new(drive)
    }
}

async fn push_buf(r: &Remote, data: &[u8], o: &PushOptions) -> Result<PushReport, SnapshotError> {
    let mut last = Progress::default();
    let rep = push(r, &mut BufferSource(data), o, &mut |p: &Progress| last = *p).await?;
    assert_eq!(
        (last.chunks_done, last.bytes_done),
        (last.chunks_total, data.len() as u64)
    );
    Ok(rep)
}

async fn restore_buf(
    r: &Remote,
    id: &SnapshotId,
    size: usize,
    keys: Option<Arc<Keys>>,
) -> Result<Vec<u8>, SnapshotError> {
    let mut sink = BufferSink(vec![0xee; size]);
    let o = RestoreOptions {
        keys,
        ..RestoreOptions::default()
    };
    restore(r, id, &mut sink, &o, &mut |_: &Progress| {}).await?;
    Ok(sink.0)
}

/// 20.5 MiB: random, a zero region, one 1 MiB block repeated three times,
/// and a short last chunk.
fn mixed_image(seed: u64) -> Vec<u8> {
    let mut d = random_bytes(20 * MIB + 512 * KIB, seed);
    d[4 * MIB..9 * MIB].fill(0);
    let block = d[..MIB].to_vec();
    for at in [10, 12, 15] {
        d[at * MIB..(at + 1) * MIB].copy_from_slice(&block);
    }
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_plain_and_encrypted_with_zero_and_repeated_chunks() {
    let Some(g) = Garage::start() else { return };
    let r = remote(&g);
    let data = mixed_image(1);
    let rep = push_buf(&r, &data, &opts("ram0", MIB as u64))
        .await
        .unwrap();
    assert_eq!(rep.chunks_total, 21);
    assert_eq!(rep.chunks_zero, 5, "{rep:?}");
    assert_eq!(rep.chunks_deduped, 3, "{rep:?}");
    assert_eq!(rep.chunks_uploaded, 13, "{rep:?}");
    assert!(rep.dedup_ratio() > 1.2, "{rep:?}");
    let id = rep.id.clone().unwrap();
    assert_eq!(
        list_snapshots(&r, Some("ram0")).await.unwrap(),
        vec![id.clone()]
    );
    assert_eq!(restore_buf(&r, &id, data.len(), None).await.unwrap(), data);

    // Encrypted: another key space; the plain addresses reveal nothing.
    let keys = Arc::new(Keys::from_secret(&[7; 32]));
    let o = PushOptions {
        keys: Some(keys.clone()),
        ..opts("ram0", MIB as u64)
    };
    let enc = push_buf(&r, &data, &o).await.unwrap();
    assert_eq!(
        enc.chunks_uploaded, 13,
        "keyed addresses differ from plain ones: {enc:?}"
    );
    let eid = enc.id.unwrap();
    assert_eq!(
        restore_buf(&r, &eid, data.len(), Some(keys)).await.unwrap(),
        data
    );
    let e = restore_buf(&r, &eid, data.len(), None).await.unwrap_err();
    assert!(e.to_string().contains("give the snapshot key"), "{e}");
    let wrong = Arc::new(Keys::from_secret(&[8; 32]));
    let e = restore_buf(&r, &eid, data.len(), Some(wrong))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("different key"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_above_8_mib_go_up_as_multipart_uploads() {
    let Some(g) = Garage::start() else { return };
    let r = remote(&g);
    let big = random_bytes(9 * MIB + 123, 10);
    r.put("big/object", big.clone()).await.unwrap();
    assert_eq!(
        r.get("big/object").await.unwrap().unwrap().as_ref(),
        &big[..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_push_uploads_only_what_changed() {
    let Some(g) = Garage::start() else { return };
    let r = remote(&g);
    let chunk = 64 * KIB;
    let mut data = random_bytes(32 * MIB, 2);
    let first = push_buf(&r, &data, &opts("db", chunk as u64))
        .await
        .unwrap();
    assert_eq!(first.chunks_uploaded, 512);
    let before = data.clone();
    // Change ~1%: five 4 KiB writes, each in its own 64 KiB chunk.
    let mut rng = ramd::sim::Rng::seed(3);
    for k in 0..5 {
        let c = k * 100 + rng.below(100) as usize;
        let at = c * chunk + 4 * KIB * rng.below(16) as usize;
        rng.fill(&mut data[at..at + 4 * KIB]);
    }
    let second = push_buf(&r, &data, &opts("db", chunk as u64))
        .await
        .unwrap();
    assert_eq!(second.chunks_uploaded, 5, "{second:?}");
    assert_eq!(second.chunks_skipped, 507, "{second:?}");
    // Five chunks plus the manifest (~17 KiB of addresses): about 1%.
    let limit = data.len() as u64 * 15 / 1000;
    assert!(
        second.bytes_uploaded < limit,
        "uploaded {} of {}: {second:?}",
        second.bytes_uploaded,
        data.len()
    );
    assert!(
        second.bytes_uploaded_plain == 5 * chunk as u64,
        "{second:?}"
    );
    let (id1, id2) = (first.id.unwrap(), second.id.unwrap());
    assert_eq!(restore_buf(&r, &id2, data.len(), None).await.unwrap(), data);
    assert_eq!(
        restore_buf(&r, &id1, data.len(), None).await.unwrap(),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_chunk_makes_restore_refuse_and_name_it() {
    let Some(g) = Garage::start() else { return };
    let r = remote(&g);
    let data = random_bytes(4 * MIB, 4);
    let id = push_buf(&r, &data, &opts("vm", MIB as u64))
        .await
        .unwrap()
        .id
        .unwrap();
    let m = ramd::snapshot::read_manifest(&r, &id, None).await.unwrap();
    let victim = m.addresses().nth(2).unwrap().object_name();
    // Garbage bytes in place of the chunk.
    r.put(&victim, b"not a chunk at all".to_vec())
        .await
        .unwrap();
    let e = restore_buf(&r, &id, data.len(), None).await.unwrap_err();
    assert!(
        matches!(e, SnapshotError::Object { ref name, .. } if *name == victim),
        "{e}"
    );
    assert!(e.to_string().contains(&victim), "{e}");
    // A well-formed object with other contents: caught by the address.
    let other = ramd::snapshot::codec::encode(&victim, &random_bytes(MIB, 5), None);
    r.put(&victim, other).await.unwrap();
    let e = restore_buf(&r, &id, data.len(), None).await.unwrap_err();
    assert!(
        matches!(e, SnapshotError::ChunkMismatch { ref name } if *name == victim),
        "{e}"
    );
    assert!(e.to_string().contains(&victim), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_and_missing_bucket_give_precise_errors() {
    let Some(g) = Garage::start() else { return };
    let data = random_bytes(MIB, 6);
    let mut bad = creds(&g);
    bad.secret_access_key = "0".repeat(64);
    let r = Remote::open(&config(&g, &g.bucket), &bad).unwrap();
    let e = push_buf(&r, &data, &opts("x", MIB as u64))
        .await
        .unwrap_err();
    assert!(
        matches!(e, SnapshotError::Remote(RemoteError::AccessDenied { .. })),
        "{e}"
    );
    eprintln!("wrong secret: {e}");
    assert!(e.to_string().contains("access denied"), "{e}");
    assert!(
        !format!("{e} {e:?}").contains(&g.secret),
        "the secret must not leak"
    );

    let r = Remote::open(&config(&g, "no-such-bucket"), &creds(&g)).unwrap();
    let e = push_buf(&r, &data, &opts("x", MIB as u64))
        .await
        .unwrap_err();
    assert!(
        matches!(e, SnapshotError::Remote(RemoteError::BucketMissing { ref bucket, .. }) if bucket == "no-such-bucket"),
        "{e}"
    );
    let e = r.check().await.unwrap_err();
    assert!(
        e.to_string()
            .contains("bucket \"no-such-bucket\" does not exist"),
        "{e}"
    );
}

/// A source that fails after `fail_after` chunk reads (a crash mid-push).
struct Failing<'a> {
    inner: BufferSource<'a>,
    reads_left: usize,
}

impl ChunkSource for Failing<'_> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.reads_left == 0 {
            return Err(std::io::Error::other("simulated crash"));
        }
        self.reads_left -= 1;
        self.inner.read_at(offset, buf)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_push_leaves_no_snapshot_and_the_next_one_resumes() {
    let Some(g) = Garage::start() else { return };
    let r = remote(&g);
    let data = random_bytes(8 * MIB, 7);
    let o = PushOptions {
        concurrency: 1,
        ..opts("web", MIB as u64)
    };
    let mut src = Failing {
        inner: BufferSource(&data),
        reads_left: 5,
    };
    let e = push(&r, &mut src, &o, &mut |_: &Progress| {})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("simulated crash"), "{e}");
    assert!(
        list_snapshots(&r, None).await.unwrap().is_empty(),
        "no manifest after a cut push"
    );
    let rep = push_buf(&r, &data, &o).await.unwrap();
    assert!(rep.chunks_skipped >= 4, "resumed: {rep:?}");
    assert_eq!(rep.chunks_skipped + rep.chunks_uploaded, 8, "{rep:?}");
    assert_eq!(
        restore_buf(&r, &rep.id.unwrap(), data.len(), None)
            .await
            .unwrap(),
        data
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_to_a_stopped_server_fails_cleanly_and_works_after_restart() {
    let Some(mut g) = Garage::start() else { return };
    let r = remote(&g);
    let data = random_bytes(3 * MIB, 8);
    let first = push_buf(&r, &data, &opts("ram1", MIB as u64))
        .await
        .unwrap();
    g.stop();
    let e = push_buf(&r, &data, &opts("ram1", MIB as u64))
        .await
        .unwrap_err();
    assert!(
        matches!(e, SnapshotError::Remote(RemoteError::Unreachable { .. })),
        "{e}"
    );
    eprintln!("server down: {e}");
    assert!(e.to_string().contains("cannot reach the server"), "{e}");
    g.restart();
    let mut changed = data.clone();
    changed[0] ^= 1;
    let second = push_buf(&r, &changed, &opts("ram1", MIB as u64))
        .await
        .unwrap();
    assert_eq!(second.chunks_uploaded, 1, "{second:?}");
    let ids = list_snapshots(&r, Some("ram1")).await.unwrap();
    assert_eq!(
        ids,
        vec![first.id.clone().unwrap(), second.id.clone().unwrap()]
    );
    assert_eq!(
        restore_buf(&r, &second.id.unwrap(), data.len(), None)
            .await
            .unwrap(),
        changed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_after_retention_keeps_every_chunk_of_kept_snapshots() {
    let Some(g) = Garage::start() else { return };
    let r = remote(&g);
    let mut data = random_bytes(6 * MIB, 9);
    let mut versions = Vec::new();
    for v in 0..4u8 {
        // Each version rewrites one chunk and the first byte of another.
        data[v as usize * MIB..(v as usize + 1) * MIB].fill(v + 1);
        data[5 * MIB] = v;
        let rep = push_buf(&r, &data, &opts("app", MIB as u64)).await.unwrap();
        versions.push((rep.id.unwrap(), data.clone()));
    }
    let o = GcOptions {
        retention: Retention {
            keep_last: Some(2),
            keep_daily: None,
        },
        grace_ms: 0,
        ..GcOptions::default()
    };
    let rep = gc(&r, &o).await.unwrap();
    assert_eq!(
        (rep.snapshots_kept, rep.snapshots_deleted),
        (2, 2),
        "{rep:?}"
    );
    assert!(rep.chunks_deleted >= 2, "{rep:?}");
    let ids = list_snapshots(&r, Some("app")).await.unwrap();
    assert_eq!(ids, vec![versions[2].0.clone(), versions[3].0.clone()]);
    for (id, want) in &versions[2..] {
        assert_eq!(
            &restore_buf(&r, id, want.len(), None).await.unwrap(),
            want,
            "{id}"
        );
    }
    // A second GC finds nothing more to delete.
    let again = gc(&r, &o).await.unwrap();
    assert_eq!(
        (again.snapshots_deleted, again.chunks_deleted),
        (0, 0),
        "{again:?}"
    );
}
