//! A snapshot's label (`ramd snapshot create --label`) is shown wherever
//! the snapshot is described: `snapshot list` (table and JSON), the push
//! that made it, a restore of it and `snapshot status`. Against Garage,
//! a plain remote and an encrypted one (whose labels are sealed in the
//! manifests' metadata and opened with the remote's key).

mod common;

use std::os::unix::fs::PermissionsExt;

use common::garage::{cli, creds_file, json, serial, Garage};
use common::snapshots::garage_and_daemon;
use common::Daemon;

/// `ramd remote add enc` for the same bucket under another prefix, with a
/// snapshot key.
fn add_encrypted_remote(d: &Daemon, g: &Garage) {
    let creds = creds_file(d.dir(), g, None);
    let key = d.dir().join("snapshot.key");
    std::fs::write(&key, [9u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = format!("s3://{}/enc", g.bucket);
    cli(
        d,
        g,
        &[
            "remote",
            "add",
            "enc",
            &url,
            "--endpoint",
            &g.endpoint,
            "--region",
            &g.region,
            "--credentials-file",
            creds.to_str().unwrap(),
            "--encrypt-key-file",
            key.to_str().unwrap(),
        ],
    )
    .ok();
}

#[test]
fn labels_show_in_listings_pushes_restores_and_status() {
    let _s = serial();
    let Some((g, d, _creds)) = garage_and_daemon(&[], &["db=16M"]) else {
        return;
    };
    add_encrypted_remote(&d, &g);
    let label = "before upgrade: ü";
    let out = cli(
        &d,
        &g,
        &["snapshot", "create", "db", "--to", "g", "--label", label],
    )
    .ok();
    assert!(out.stdout.contains(&format!("({label:?}) pushed")), "{out}");
    cli(&d, &g, &["snapshot", "create", "db", "--to", "g"]).ok();
    let sealed = "sealed one";
    let v = json(
        &cli(
            &d,
            &g,
            &[
                "snapshot",
                "create",
                "db",
                "--to",
                "enc",
                "--label",
                sealed,
                "--encrypt",
                "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(v["push"]["label"], sealed, "{v}");

    // The listing: the labels in push order, none for the unlabelled one.
    let v = json(&cli(&d, &g, &["snapshot", "list", "db", "--json"]).ok());
    let of = |remote: &str| -> Vec<serde_json::Value> {
        v["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["remote"] == remote)
            .map(|s| s["label"].clone())
            .collect()
    };
    assert_eq!(of("g"), [label.into(), serde_json::Value::Null], "{v}");
    assert_eq!(of("enc"), [serde_json::Value::from(sealed)], "{v}");
    let table = cli(&d, &g, &["snapshot", "list", "db"]).ok().stdout;
    let header = table.lines().next().unwrap_or_default();
    assert!(header.trim_end().ends_with("LABEL"), "{table}");
    for want in [label, sealed] {
        assert!(table.contains(want), "{want} not in:\n{table}");
    }

    // The last push per remote, in `snapshot status`.
    let status = cli(&d, &g, &["snapshot", "status", "db"]).ok().stdout;
    assert!(status.contains(&format!("({sealed:?})")), "{status}");

    // A restore of the labelled snapshot names it (from its manifest).
    let id = v["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["label"] == label)
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .unwrap();
    let out = cli(
        &d,
        &g,
        &[
            "restore",
            "db",
            "--from",
            "g",
            "--snapshot",
            &id,
            "--as",
            "copy",
        ],
    )
    .ok();
    assert!(out.stdout.contains(&format!("{id} ({label:?})")), "{out}");
    let v = json(
        &cli(
            &d,
            &g,
            &["restore", "db", "--from", "enc", "--as", "copy2", "--json"],
        )
        .ok(),
    );
    assert_eq!(v["restore"]["label"], sealed, "{v}");
}
