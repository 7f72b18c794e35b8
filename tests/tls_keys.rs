//! Certificates a user brings: a key the TLS library cannot use is named
//! for what it is, and the URIs the daemon shows are ones a client can use.

mod common;

use std::path::Path;
use std::time::Duration;

use common::pki::{issue, make_ca, openssl};
use common::*;

/// `ramd daemon ARGS` in `dir` that is expected to refuse to start: its
/// output.
fn refused_start(dir: &Path, args: &[&str]) -> Output {
    let out = try_run(
        ramd()
            .arg("daemon")
            .arg("--no-config")
            .arg("--socket")
            .arg(dir.join("nbd.sock"))
            .arg("--api-socket")
            .arg(dir.join("api.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(args),
        Duration::from_secs(60),
    )
    .expect("ramd exits on a bad certificates directory");
    out.failed()
}

/// The NBD reference tester ships a 2432-bit RSA server key: ring takes
/// RSA keys of 2048, 3072 and 4096 bits only. Refused with the reason
/// and what to do, not "failed to parse private key".
#[test]
fn an_rsa_key_of_an_odd_size_is_refused_with_its_size_and_the_remedy() {
    if !require(&["openssl"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    openssl(
        &certs,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2432",
            "-nodes",
            "-keyout",
            "server-key.pem",
            "-out",
            "server-cert.pem",
            "-subj",
            "/CN=localhost",
            "-days",
            "2",
        ],
    );
    let out = refused_start(
        tmp.path(),
        &[
            "--nbd-listen",
            "127.0.0.1:0",
            "--tls-certificates",
            certs.to_str().unwrap(),
        ],
    );
    assert!(out.stderr.contains("2432-bit RSA key"), "{out}");
    assert!(out.stderr.contains("2048, 3072 or 4096"), "{out}");
    assert!(out.stderr.contains("openssl genpkey"), "{out}");
    assert!(!out.stderr.contains("failed to parse private key"), "{out}");
}

/// With TLS required on the unix socket, the URIs the daemon shows are
/// `nbds+unix://` (a plain client cannot use the socket then), and
/// nbdinfo reaches the drive through the URI `ramd list` prints plus the
/// certificates.
#[test]
fn a_unix_socket_that_requires_tls_is_shown_as_nbds_unix() {
    if !require(&["openssl", "nbdinfo"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ca = tmp.path().join("ca");
    make_ca(&ca, "test CA");
    let (cert, key) = issue(&ca, "localhost", "server", None);
    let certs = tmp.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    std::fs::copy(cert, certs.join("server-cert.pem")).unwrap();
    std::fs::copy(key, certs.join("server-key.pem")).unwrap();
    let d = Daemon::launch(
        &[
            "daemon".into(),
            "--drive".into(),
            "t=16M".into(),
            "--tls-certificates".into(),
            certs.to_str().unwrap().into(),
            "--nbd-socket-tls".into(),
            "require".into(),
        ],
        &[],
    );
    let list = run(d.cli().args(["list", "--json"])).ok();
    let v: serde_json::Value = serde_json::from_str(&list.stdout).unwrap();
    let uri = v["drives"][0]["uri"]
        .as_str()
        .or_else(|| v[0]["uri"].as_str())
        .unwrap_or_else(|| panic!("no uri in {v}"))
        .to_owned();
    assert!(uri.starts_with("nbds+unix:///t?socket="), "{uri}");
    let info = run(d.cli().args(["info", "t"])).ok();
    assert!(info.stdout.contains("nbds+unix:///t"), "{info}");
    // The plain URI is refused by the server; the shown one works with
    // the CA (libnbd takes the CA from tls-certificates=DIR here: nbdinfo
    // 1.14 accepts it in the URI, unlike fio and nbdsh).
    let pki = tmp.path().join("client");
    std::fs::create_dir(&pki).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), pki.join("ca-cert.pem")).unwrap();
    let with_ca = format!("{uri}&tls-certificates={}", pki.display());
    run(tool("nbdinfo").arg("--size").arg(&with_ca)).ok();
    run(tool("nbdinfo").arg("--size").arg(d.uri("t"))).failed();
}
