//! A test PKI made with openssl: a CA with an `openssl ca` database (so
//! certificates can be revoked and dated), and server or client
//! certificates it signs (EC P-256). Shared by the TLS tests of the NBD
//! server, the daemon and the cache's NBD client.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::run;

/// Runs `openssl ARGS` in `dir`; panics with its output on failure.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = run(Command::new("openssl").current_dir(dir).args(args));
    assert!(out.status.success(), "{out}");
}

const CA_CONFIG: &str = "\
[ ca ]
default_ca = local
[ local ]
dir = .
database = index.txt
new_certs_dir = .
serial = serial
crlnumber = crlnumber
default_md = sha256
default_days = 30
default_crl_days = 30
policy = any
unique_subject = no
[ any ]
commonName = supplied
[ server ]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
[ client ]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
";

/// A CA in `dir` (ca-key.pem, ca-cert.pem and an `openssl ca` database).
pub fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.cnf"), CA_CONFIG).unwrap();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("serial"), "1000\n").unwrap();
    std::fs::write(dir.join("crlnumber"), "1000\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "30",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A key and a certificate for `cn` signed by the CA in `ca` with the
/// config section `kind`; `dates` overrides the validity.
pub fn issue(ca: &Path, cn: &str, kind: &str, dates: Option<(&str, &str)>) -> (PathBuf, PathBuf) {
    let key = ca.join(format!("{cn}-key.pem"));
    let csr = ca.join(format!("{cn}.csr"));
    let cert = ca.join(format!("{cn}-cert.pem"));
    openssl(
        ca,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            csr.to_str().unwrap(),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    let mut args = vec![
        "ca",
        "-batch",
        "-notext",
        "-config",
        "ca.cnf",
        "-cert",
        "ca-cert.pem",
        "-keyfile",
        "ca-key.pem",
        "-extensions",
        kind,
        "-in",
        csr.to_str().unwrap(),
        "-out",
        cert.to_str().unwrap(),
    ];
    if let Some((start, end)) = dates {
        args.extend(["-startdate", start, "-enddate", end]);
    }
    openssl(ca, &args);
    (cert, key)
}

/// A CA under `root/ca` named `ca_name` and a daemon certificates
/// directory `root/server` holding its `localhost` server certificate and
/// key (CN=localhost; the CA's config adds the SANs): the directory to
/// give `--tls-certificates`.
pub fn server_dir(root: &Path, ca_name: &str) -> PathBuf {
    let ca = root.join("ca");
    make_ca(&ca, ca_name);
    issue(&ca, "localhost", "server", None);
    let server = root.join("server");
    std::fs::create_dir_all(&server).unwrap();
    for (from, to) in [
        ("localhost-cert.pem", "server-cert.pem"),
        ("localhost-key.pem", "server-key.pem"),
    ] {
        std::fs::copy(ca.join(from), server.join(to)).unwrap();
    }
    server
}
