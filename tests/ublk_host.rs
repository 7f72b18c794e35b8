//! `ramd attach NAME --ublk` where the kernel has no ublk driver loaded
//! (this machine's kernel has none: no /dev/ublk-control): the CLI and the
//! API refuse with a message naming `modprobe ublk_drv`, and nothing is
//! attached. The device itself is tested in the guest (guest_ublk.rs).

mod common;

use common::*;

#[test]
fn attach_ublk_without_the_driver_names_modprobe() {
    if std::path::Path::new("/dev/ublk-control").exists() {
        eprintln!("SKIPPED: /dev/ublk-control exists here (tests/guest_ublk.rs covers the device)");
        return;
    }
    let d = Daemon::start(&["db=16M"]);
    let out = d.cli().args(["attach", "db", "--ublk"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("modprobe ublk_drv"), "{err}");
    assert!(err.contains("/dev/ublk-control"), "{err}");

    let (status, body) = d.http(
        "POST",
        "/v1/attachments",
        Some(r#"{"drive": "db", "kind": "ublk"}"#),
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("ublk_unavailable"), "{body}");
    // A mountpoint makes no sense for a block device.
    let (status, body) = d.http(
        "POST",
        "/v1/attachments",
        Some(r#"{"drive": "db", "kind": "ublk", "mountpoint": "/mnt"}"#),
    );
    assert_eq!(status, 422, "{body}");

    let (status, body) = d.http("GET", "/v1/attachments", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""attachments":[]"#), "{body}");
    let out = d.cli().args(["detach", "db"]).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
}
