//! Per-export access rules (issue 17 item 2): `[[drive]]` entries with
//! `allow_identities`, `read_only_identities` and `allow_networks`, served
//! by `ramd daemon` over TLS with client certificates and driven by real
//! clients (nbdinfo, nbdsh, a libnbd session in Python).
//!
//! ```text
//! ca  signs  server (CN=localhost, SAN localhost + 127.0.0.1 + 127.0.0.2)
//!     signs  alice, bob (client certificates, CN = the identity)
//!
//! drive a: alice read-write, bob read-only
//! drive b: alice only
//! drive c: anyone from 127.0.0.2/32
//! ```
//!
//! Connecting to a loopback address always comes from 127.0.0.1 (the
//! route's `src`), so the network test binds its own socket to 127.0.0.2
//! and hands it to libnbd (`connect_socket`); the same from 127.0.0.1 is
//! refused. A missing tool fails its test; RAMD_SKIP_MISSING_TOOLS=1 skips
//! instead (see `common::require`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{python, require, require_python_module, run, tool, Daemon, SKIP_ENV};

#[track_caller]
fn require_openssl() -> bool {
    if Command::new("openssl").arg("version").output().is_ok() {
        return true;
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: missing tool openssl ({SKIP_ENV}=1)");
        return false;
    }
    panic!("missing tool openssl: install with apt-get install openssl");
}

#[track_caller]
fn openssl(dir: &Path, args: &[&str]) {
    let out = run(Command::new("openssl").current_dir(dir).args(args));
    assert!(out.status.success(), "{out}");
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// Signs `NAME.csr` in `dir` with the CA there into `NAME-cert.pem`.
fn sign(dir: &Path, name: &str, ext: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    let csr = format!("{name}.csr");
    let cert = format!("{name}-cert.pem");
    let extfile = format!("{name}.ext");
    let args = [
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        &extfile,
        "-out",
        &cert,
    ];
    openssl(dir, &args);
}

/// Makes a key and a CSR `NAME-key.pem`, `NAME.csr` with CN `cn`.
fn request(dir: &Path, name: &str, cn: &str) {
    let key = format!("{name}-key.pem");
    let csr = format!("{name}.csr");
    let subj = format!("/CN={cn}");
    let mut args = vec!["req", "-new"];
    args.extend(EC);
    args.extend(["-nodes", "-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args);
}

/// The certificates: the server's directory (`server/`, with the CA so
/// client certificates are required) and one client directory per
/// identity (`alice/`, `bob/`).
struct Pki {
    root: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        let mut args = vec!["req", "-x509"];
        args.extend(EC);
        args.extend(["-nodes", "-keyout", "ca-key.pem", "-out", "ca-cert.pem"]);
        args.extend(["-days", "30", "-subj", "/CN=ramd access test CA"]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(d, &args);
        request(d, "server", "localhost");
        sign(
            d,
            "server",
            "basicConstraints = CA:FALSE\nextendedKeyUsage = serverAuth\n\
             subjectAltName = DNS:localhost, IP:127.0.0.1, IP:127.0.0.2\n",
        );
        let server = d.join("server");
        std::fs::create_dir_all(&server).unwrap();
        for f in ["ca-cert.pem", "server-cert.pem", "server-key.pem"] {
            std::fs::copy(d.join(f), server.join(f)).unwrap();
        }
        for who in ["alice", "bob"] {
            request(d, who, who);
            sign(
                d,
                who,
                "basicConstraints = CA:FALSE\nextendedKeyUsage = clientAuth\n",
            );
            let c = d.join(who);
            std::fs::create_dir_all(&c).unwrap();
            std::fs::copy(d.join("ca-cert.pem"), c.join("ca-cert.pem")).unwrap();
            std::fs::copy(d.join(format!("{who}-cert.pem")), c.join("client-cert.pem")).unwrap();
            std::fs::copy(d.join(format!("{who}-key.pem")), c.join("client-key.pem")).unwrap();
        }
        Pki { root }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }
}

const CONFIG: &str = r#"
[[drive]]
name = "a"
size = "16M"
allow_identities = ["alice"]
read_only_identities = ["bob"]

[[drive]]
name = "b"
size = "16M"
allow_identities = ["alice"]

[[drive]]
name = "c"
size = "16M"
allow_networks = ["127.0.0.2/32"]
"#;

/// A daemon with `CONFIG`, TLS with client certificates on 127.0.0.1 and
/// 127.0.0.2 (free ports): the daemon and the two addresses.
fn daemon(pki: &Pki) -> (Daemon, String, String) {
    let config = pki.root.path().join("ramd.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let args: Vec<String> = [
        "daemon",
        "--config",
        config.to_str().unwrap(),
        "--nbd-listen",
        "127.0.0.1:0",
        "--nbd-listen",
        "127.0.0.2:0",
        "--tls-certificates",
        pki.dir("server").to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let d = Daemon::launch(&args, &[]);
    let (status, body) = d.http("GET", "/v1/health", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let addrs: Vec<String> = v["nbd_tcp"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let one = addrs.iter().find(|a| a.starts_with("127.0.0.1:")).unwrap();
    let two = addrs.iter().find(|a| a.starts_with("127.0.0.2:")).unwrap();
    (d, one.clone(), two.clone())
}

fn uri(addr: &str, export: &str, pki: &Pki, who: &str) -> String {
    let certs = pki.dir(who);
    format!(
        "nbds://{addr}/{export}?tls-certificates={}",
        certs.display()
    )
}

/// The exports `nbdinfo --list` shows `who`.
fn listed(addr: &str, pki: &Pki, who: &str) -> Vec<String> {
    let out = run(tool("nbdinfo").args(["--list", "--json", &uri(addr, "", pki, who)]));
    assert!(out.status.success(), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let mut names: Vec<String> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// A libnbd session for `who` on `export` that writes and reads back;
/// prints `wrote` or the write's errno name.
fn write_as(addr: &str, export: &str, pki: &Pki, who: &str) -> String {
    let script = "import nbd, errno, sys\n\
        h = nbd.NBD()\n\
        h.set_uri_allow_local_file(True)\n\
        h.connect_uri(sys.argv[1])\n\
        print('read_only', h.is_read_only())\n\
        try:\n    h.pwrite(b'\\x5a' * 4096, 0)\n    assert h.pread(4096, 0) == b'\\x5a' * 4096\n    print('wrote')\n\
        except nbd.Error as e:\n    print('write failed', errno.errorcode.get(e.errnum))\n";
    let out = python(script, &[&uri(addr, export, pki, who)]);
    assert!(out.status.success(), "{out}");
    out.stdout
}

/// Connects from a socket bound to `from` to `to`, over TLS as alice;
/// prints the size or the failure.
fn connect_from(from: &str, to: &str, export: &str, pki: &Pki) -> String {
    let (host, port) = to.rsplit_once(':').unwrap();
    let script = "import nbd, socket, sys\n\
        s = socket.socket()\n\
        s.bind((sys.argv[1], 0))\n\
        s.connect((sys.argv[2], int(sys.argv[3])))\n\
        h = nbd.NBD()\n\
        h.set_tls(nbd.TLS_REQUIRE)\n\
        h.set_tls_certificates(sys.argv[5])\n\
        h.set_export_name(sys.argv[4])\n\
        try:\n    h.connect_socket(s.detach())\n    print('size', h.get_size())\n\
        except nbd.Error as e:\n    print('refused', e)\n";
    let certs = pki.dir("alice");
    let out = python(script, &[from, host, port, export, certs.to_str().unwrap()]);
    assert!(out.status.success(), "{out}");
    out.stdout
}

/// alice sees and writes a and b; bob sees a read-only (EPERM on writes)
/// and not b, which fails for him exactly as a missing export does; the
/// refusals are logged and counted.
#[test]
fn identities_see_and_write_what_the_rules_allow() {
    if !require_openssl()
        || !require(&["nbdinfo"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let pki = Pki::new();
    let (d, addr, _) = daemon(&pki);
    // c is open only to 127.0.0.2, and these clients come from 127.0.0.1.
    assert_eq!(listed(&addr, &pki, "alice"), ["a", "b"]);
    assert_eq!(listed(&addr, &pki, "bob"), ["a"]);

    let alice = write_as(&addr, "a", &pki, "alice");
    assert!(
        alice.contains("read_only False") && alice.contains("wrote"),
        "{alice}"
    );
    let bob = write_as(&addr, "a", &pki, "bob");
    assert!(
        bob.contains("read_only True") && bob.contains("write failed EPERM"),
        "{bob}"
    );
    let info = run(tool("nbdinfo").arg(uri(&addr, "a", &pki, "bob")));
    assert!(
        info.status.success() && info.stdout.contains("is_read_only: true"),
        "{info}"
    );

    // b for bob: the same failure as an export that does not exist.
    let hidden = run(tool("nbdinfo").arg(uri(&addr, "b", &pki, "bob")));
    let missing = run(tool("nbdinfo").arg(uri(&addr, "nosuch", &pki, "bob")));
    assert!(!hidden.status.success() && !missing.status.success());
    assert_eq!(
        hidden.stderr.replace("export: b\n", "export: X\n"),
        missing.stderr.replace("export: nosuch\n", "export: X\n"),
        "a hidden export must look missing"
    );

    let (status, metrics) = d.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("ramd_nbd_refusals_total{reason=\"not_allowed\"}"))
        .unwrap_or_else(|| panic!("no refusal counter:\n{metrics}"));
    let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1, "{line}");
    let log = d.log();
    assert!(
        log.lines().any(|l| l.contains("NBD client refused")
            && l.contains("identity=\"bob\"")
            && l.contains("export=b")
            && l.contains("peer=127.0.0.1:")),
        "the refusal is logged with peer, identity and export:\n{log}"
    );
}

/// A network rule: c (127.0.0.2/32 only) opens for a client whose socket
/// is bound to 127.0.0.2 and is refused, as unknown, from 127.0.0.1.
#[test]
fn source_networks_are_enforced() {
    if !require_openssl() || !require_python_module("nbd", "python3-libnbd") {
        return;
    }
    let pki = Pki::new();
    let (_d, _, two) = daemon(&pki);
    let ok = connect_from("127.0.0.2", &two, "c", &pki);
    assert!(ok.contains("size 16777216"), "{ok}");
    let refused = connect_from("127.0.0.1", &two, "c", &pki);
    assert!(refused.contains("refused"), "{refused}");
    // The other drives do not care where a client comes from.
    let other = connect_from("127.0.0.1", &two, "b", &pki);
    assert!(other.contains("size 16777216"), "{other}");
}
