//! Persistent drives on real files: the image is a raw disk image that
//! qemu-img and qemu-io read as they are (sparse where the drive never held
//! data), and a drive survives close/reopen with large data.

mod common;

use std::sync::Arc;

use common::{require, run, tool};
use ramd::block::backend::Backend;
use ramd::persist::{
    DirStorage, Key, PersistConfig, PersistentDrive, RestoreOptions, RestoreProgress,
};
use ramd::store::{MemoryBudget, StoreOptions};

const MIB: u64 = 1 << 20;

fn budget() -> Arc<MemoryBudget> {
    Arc::new(MemoryBudget::new(u64::MAX))
}

#[test]
fn qemu_tools_read_the_image_of_a_plain_drive() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ram0");
    let size = 64 * MIB + 512;
    let d = PersistentDrive::create(
        DirStorage::create_dir(&state).unwrap(),
        size,
        None,
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .unwrap();
    d.write(0, &vec![0x5a; MIB as usize], false).unwrap();
    d.write(40 * MIB + 123, &vec![0xa5; 70_000], false).unwrap();
    d.write(size - 512, &[0x33; 512], false).unwrap();
    d.close().unwrap();
    let image = state.join("image");
    let img = image.to_str().unwrap();

    let info = run(tool("qemu-img").args(["info", "--output=json", "-f", "raw", img])).ok();
    assert!(
        info.stdout.contains(&format!("\"virtual-size\": {size}")),
        "{}",
        info.stdout
    );

    let io = |cmd: &str| run(tool("qemu-io").args(["-f", "raw", "-r", "-c", cmd, img])).ok();
    for cmd in [
        format!("read -P 0x5a 0 {MIB}"),
        format!("read -P 0xa5 {} 70000", 40 * MIB + 123),
        format!("read -P 0 {} {}", MIB, 39 * MIB),
        format!("read -P 0x33 {} 512", size - 512),
    ] {
        let out = io(&cmd);
        assert!(
            !out.stdout.contains("Pattern verification failed"),
            "{cmd}: {}",
            out.stdout
        );
    }
    // Sparse: the allocation map holds data only where the drive did.
    let map = run(tool("qemu-img").args(["map", "--output=json", "-f", "raw", img])).ok();
    let data_bytes: u64 = map
        .stdout
        .lines()
        .filter(|l| l.contains("\"data\": true"))
        .filter_map(|l| {
            let start = l.find("\"length\": ")? + 10;
            l[start..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(
        (MIB + 70_000..4 * MIB).contains(&data_bytes),
        "{}",
        map.stdout
    );
    // qemu-img compare agrees with the drive's bytes.
    let copy = dir.path().join("copy.raw");
    let mut all = vec![0u8; size as usize];
    let r = PersistentDrive::open(
        DirStorage::open_dir(&state).unwrap(),
        None,
        RestoreOptions::default(),
        &RestoreProgress::new(),
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .unwrap()
    .0;
    r.read(0, &mut all).unwrap();
    std::fs::write(&copy, &all).unwrap();
    run(tool("qemu-img").args([
        "compare",
        "-f",
        "raw",
        "-F",
        "raw",
        img,
        copy.to_str().unwrap(),
    ]))
    .ok();
}

#[test]
fn encrypted_image_is_not_raw_readable() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("secret");
    let key = Key::generate().unwrap();
    let d = PersistentDrive::create(
        DirStorage::create_dir(&state).unwrap(),
        8 * MIB,
        Some(&key),
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .unwrap();
    let secret = b"the launch codes are 0000".repeat(100);
    d.write(MIB, &secret, false).unwrap();
    d.close().unwrap();
    for f in ["image", "pages", "journal", "meta"] {
        let bytes = std::fs::read(state.join(f)).unwrap();
        assert!(
            !bytes.windows(25).any(|w| w == &secret[..25]),
            "plaintext in {f}"
        );
    }
    let r = PersistentDrive::open(
        DirStorage::open_dir(&state).unwrap(),
        Some(&key),
        RestoreOptions::default(),
        &RestoreProgress::new(),
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .unwrap()
    .0;
    let mut back = vec![0u8; secret.len()];
    r.read(MIB, &mut back).unwrap();
    assert_eq!(back, secret);
}

#[test]
fn a_large_sparse_drive_restores_only_its_data() {
    // 5 GiB: the page table spans several windows; the image stays sparse.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("big");
    let size = 5u64 << 30;
    let d = PersistentDrive::create(
        DirStorage::create_dir(&state).unwrap(),
        size,
        None,
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .unwrap();
    d.write(4096, &[1; 4096], false).unwrap();
    d.write((4u64 << 30) + 12345, &[2; 10_000], false).unwrap();
    d.write(size - 100, &[3; 100], false).unwrap();
    d.close().unwrap();
    let used = std::fs::metadata(state.join("image")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(used.blocks() * 512 < 1 << 20, "the image is sparse");
    let (r, report) = PersistentDrive::open(
        DirStorage::open_dir(&state).unwrap(),
        None,
        RestoreOptions::default(),
        &RestoreProgress::new(),
        PersistConfig::default(),
        StoreOptions::default(),
        budget(),
    )
    .unwrap();
    assert_eq!(report.image_data_bytes, 4 * 4096 + 4096);
    assert!(r.store().allocated_bytes() <= 5 * 4096);
    let mut b = vec![0u8; 10_000];
    r.read((4u64 << 30) + 12345, &mut b).unwrap();
    assert_eq!(b, vec![2; 10_000]);
    let mut b = vec![0u8; 100];
    r.read(size - 100, &mut b).unwrap();
    assert_eq!(b, vec![3; 100]);
}
