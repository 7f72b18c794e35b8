//! Per-export access rules (issue 17 item 2): `[[drive]]` entries with
//! `allow_identities`, `read_only_identities` and `allow_networks`, and
//! the same rules set through the API and the command line (`ramd create
//! --allow-identity ...`, `ramd access`), changed live and kept by
//! persistent drives; the per-identity connection limit; caches under the
//! same rules (`[[cache]]`, `ramd cache create`, `PATCH /v1/caches`). Served by `ramd
//! daemon` over TLS with client certificates and driven by real clients
//! (nbdinfo, a libnbd session in Python).
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
use std::time::Duration;

use common::pysession::PySession;
use common::{python, require, require_python_module, run, tool, wait_until, Daemon, SKIP_ENV};

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
    daemon_with(pki, CONFIG, &[])
}

/// A daemon with `config` and `extra` flags, TLS as `daemon` says.
fn daemon_with(pki: &Pki, config: &str, extra: &[&str]) -> (Daemon, String, String) {
    let path = pki.root.path().join("ramd.toml");
    std::fs::write(&path, config).unwrap();
    let mut args: Vec<String> = [
        "daemon",
        "--config",
        path.to_str().unwrap(),
        "--nbd-listen",
        "127.0.0.1:0",
        "--nbd-listen",
        "127.0.0.2:0",
        "--tls-certificates",
        pki.dir("server").to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    let d = Daemon::launch(&args, &[]);
    addresses(d)
}

/// The daemon and its 127.0.0.1 and 127.0.0.2 listeners.
fn addresses(d: Daemon) -> (Daemon, String, String) {
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
    // The refusal is logged with peer, identity and export.
    d.wait_log("the refusal", |log| {
        log.lines().any(|l| {
            l.contains("NBD client refused")
                && l.contains("identity=\"bob\"")
                && l.contains("export=b")
                && l.contains("peer=127.0.0.1:")
        })
    });
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

/// The value of `ramd_nbd_refusals_total{reason}`.
fn refusals(d: &Daemon, reason: &str) -> u64 {
    let (status, metrics) = d.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    let series = format!("ramd_nbd_refusals_total{{reason=\"{reason}\"}} ");
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&series))
        .unwrap_or_else(|| panic!("no {series}:\n{metrics}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// One identity cannot take every connection: with a limit of 2, alice's
/// third connection is refused after its TLS handshake with the reason
/// (NBD_REP_ERR_POLICY), logged with peer and identity and counted, while
/// bob still gets in; when one of alice's ends, she gets in again.
#[test]
fn one_identity_cannot_take_every_connection() {
    if !require_openssl()
        || !require(&["nbdinfo"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let pki = Pki::new();
    let (d, addr, _) = daemon_with(
        &pki,
        "[[drive]]\nname = \"a\"\nsize = \"16M\"\n",
        &["--max-connections-per-identity", "2"],
    );
    let mut first = PySession::open(&uri(&addr, "a", &pki, "alice"));
    let second = PySession::open(&uri(&addr, "a", &pki, "alice"));
    // libnbd shows the server's message in its debug output.
    let third = run(tool("nbdinfo")
        .env("LIBNBD_DEBUG", "1")
        .arg(uri(&addr, "a", &pki, "alice")));
    assert!(!third.status.success(), "{third}");
    assert!(
        third.stderr.contains("identity 'alice' has 2 connections"),
        "the client's error names the limit:\n{third}"
    );
    assert_eq!(refusals(&d, "per_identity_limit"), 1);
    // The refusal is logged with peer and identity.
    d.wait_log("the refusal", |log| {
        log.lines().any(|l| {
            l.contains("the limit per identity")
                && l.contains("identity=\"alice\"")
                && l.contains("peer=127.0.0.1:")
        })
    });
    // Another identity is not affected, nor are alice's open sessions.
    let bob = run(tool("nbdinfo").arg(uri(&addr, "a", &pki, "bob")));
    assert!(bob.status.success(), "{bob}");
    assert!(first.round_trip());
    // A session that ends gives its slot back.
    drop(second);
    wait_until("alice to get a slot back", Duration::from_secs(20), || {
        run(tool("nbdinfo").arg(uri(&addr, "a", &pki, "alice")))
            .status
            .success()
    });
}

/// Access rules through the command line and the API: `ramd create
/// --allow-identity/--read-only-identity`, shown by `ramd info` and GET;
/// bad values refused with the value named; `ramd access` changes them
/// live (an open session the new rules narrow is closed; new connections
/// get the new grant); `--allow-network` and `--open`; PATCH changes one
/// list and leaves the others.
#[test]
fn rules_set_through_the_cli_and_api_apply_live() {
    if !require_openssl()
        || !require(&["nbdinfo"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let pki = Pki::new();
    let (d, addr, two) = daemon_with(&pki, "", &["--no-default-drive"]);
    let ok = run(d.cli().args([
        "create",
        "d",
        "--size",
        "16M",
        "--allow-identity",
        "alice",
        "--read-only-identity",
        "bob",
    ]));
    assert!(ok.status.success(), "{ok}");
    let info = run(d.cli().args(["info", "d"]));
    assert!(
        info.stdout.contains("identities alice; read-only bob"),
        "{info}"
    );
    let (_, body) = d.http("GET", "/v1/drives/d", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["access"],
        serde_json::json!({"allow_identities": ["alice"], "read_only_identities": ["bob"], "allow_networks": []})
    );
    assert_eq!(listed(&addr, &pki, "bob"), ["d"]);
    let bob = write_as(&addr, "d", &pki, "bob");
    assert!(bob.contains("write failed EPERM"), "{bob}");

    // Bad values: a usage error before any request, and the API's own.
    let bad = run(d.cli().args([
        "create",
        "e",
        "--size",
        "1M",
        "--allow-network",
        "10.0.0.0/33",
    ]));
    assert_eq!(bad.code(), 2, "{bad}");
    assert!(
        bad.stderr.contains("'10.0.0.0/33' is not a network"),
        "{bad}"
    );
    let (status, body) = d.http(
        "POST",
        "/v1/drives",
        Some(r#"{"name": "e", "size": "1M", "access": {"allow_networks": ["unix", "lan"]}}"#),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("invalid_access") && body.contains("'lan' is not a network"),
        "{body}"
    );
    let (status, body) = d.http(
        "PATCH",
        "/v1/drives/d",
        Some(r#"{"access": {"read_only_identities": [""]}}"#),
    );
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("an identity cannot be empty"), "{body}");

    // alice writes in an open session; made read-only, the session is
    // closed (it negotiated read-write) and she comes back read-only.
    let mut session = PySession::open(&uri(&addr, "d", &pki, "alice"));
    assert!(session.round_trip());
    let set = run(d.cli().args([
        "access",
        "d",
        "--read-only-identity",
        "alice",
        "--read-only-identity",
        "bob",
    ]));
    assert!(set.status.success(), "{set}");
    assert!(set.stderr.contains("closed 1 NBD connection"), "{set}");
    assert!(set.stdout.contains("d: read-only alice, bob"), "{set}");
    wait_until(
        "alice's session to be closed",
        Duration::from_secs(20),
        || !session.round_trip(),
    );
    let alice = write_as(&addr, "d", &pki, "alice");
    assert!(
        alice.contains("read_only True") && alice.contains("write failed EPERM"),
        "{alice}"
    );

    // Networks: only 127.0.0.2 now, for everyone listed.
    let set = run(d.cli().args([
        "access",
        "d",
        "--allow-identity",
        "alice",
        "--allow-network",
        "127.0.0.2/32",
    ]));
    assert!(set.status.success(), "{set}");
    assert!(connect_from("127.0.0.2", &two, "d", &pki).contains("size 16777216"));
    assert!(connect_from("127.0.0.1", &two, "d", &pki).contains("refused"));
    // PATCH one list: the identities stay.
    let (status, body) = d.http(
        "PATCH",
        "/v1/drives/d",
        Some(r#"{"access": {"allow_networks": []}}"#),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["access"]["allow_identities"],
        serde_json::json!(["alice"])
    );
    assert_eq!(listed(&addr, &pki, "bob"), Vec::<String>::new());
    // Open: everyone again, read-write.
    let open = run(d.cli().args(["access", "d", "--open"]));
    assert!(
        open.status.success() && open.stdout.contains("open to every client"),
        "{open}"
    );
    let bob = write_as(&addr, "d", &pki, "bob");
    assert!(bob.contains("wrote"), "{bob}");
    let shown = run(d.cli().args(["access", "d", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(v["allow_identities"], serde_json::json!([]));
}

/// A persistent drive keeps its rules across a restart (in its
/// drive.json), so a restart never opens it to everyone.
#[test]
fn a_persistent_drive_keeps_its_rules_across_a_restart() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let pki = Pki::new();
    let (mut d, addr, _) = daemon_with(&pki, "", &["--no-default-drive"]);
    let ok = run(d.cli().args([
        "create",
        "p",
        "--size",
        "4M",
        "--persist",
        "--allow-identity",
        "alice",
    ]));
    assert!(ok.status.success(), "{ok}");
    assert_eq!(listed(&addr, &pki, "bob"), Vec::<String>::new());
    d.terminate();
    d.restart();
    let (d, addr, _) = addresses(d);
    wait_until("p to be restored", Duration::from_secs(20), || {
        let (_, body) = d.http("GET", "/v1/drives/p", None);
        body.contains("\"state\":\"ready\"")
    });
    let (_, body) = d.http("GET", "/v1/drives/p", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["access"]["allow_identities"],
        serde_json::json!(["alice"]),
        "{v}"
    );
    assert_eq!(listed(&addr, &pki, "bob"), Vec::<String>::new());
    assert_eq!(listed(&addr, &pki, "alice"), ["p"]);
}

/// The same rules given on the command line (`--drive NAME=SIZE,...`):
/// identities and read-only identities as in the config, and a network.
#[test]
fn rules_given_with_drive_flags() {
    if !require_openssl()
        || !require(&["nbdinfo"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let pki = Pki::new();
    let (_d, one, two) = daemon_with(
        &pki,
        "",
        &[
            "--drive",
            "p=16M,allow-identity=alice,read-only-identity=bob",
            "--drive",
            "q=16M,allow-network=127.0.0.2/32",
        ],
    );
    assert_eq!(listed(&one, &pki, "alice"), ["p"]);
    assert_eq!(listed(&one, &pki, "bob"), ["p"]);
    let bob = write_as(&one, "p", &pki, "bob");
    assert!(
        bob.contains("read_only True") && bob.contains("write failed EPERM"),
        "{bob}"
    );
    let alice = write_as(&one, "p", &pki, "alice");
    assert!(alice.contains("wrote"), "{alice}");
    let ok = connect_from("127.0.0.2", &two, "q", &pki);
    assert!(ok.contains("size 16777216"), "{ok}");
    let refused = connect_from("127.0.0.1", &two, "q", &pki);
    assert!(refused.contains("refused"), "{refused}");
}

/// Caches take the drives' rules (issue 28): `[[cache]]` keys, `ramd cache
/// create` flags, `POST /v1/caches`, `ramd access` and `PATCH
/// /v1/caches/{name}` changing them live; a deleted cache leaves no rules
/// behind for the next export of its name.
#[test]
fn caches_take_the_same_rules() {
    if !require_openssl()
        || !require(&["nbdinfo"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let pki = Pki::new();
    let backing = |name: &str| {
        let p = pki.root.path().join(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        p.display().to_string()
    };
    let (k, m) = (backing("k.img"), backing("m.img"));
    let config = format!(
        "[[cache]]\nname = \"k\"\nbacking = \"{k}\"\nsize = \"4M\"\nmode = \"writeback\"\n\
         allow_identities = [\"alice\"]\nread_only_identities = [\"bob\"]\n\n\
         [[cache]]\nname = \"m\"\nbacking = \"{m}\"\nsize = \"4M\"\nmode = \"writethrough\"\n\
         allow_identities = [\"alice\"]\n"
    );
    let (d, addr, two) = daemon_with(&pki, &config, &["--no-default-drive"]);
    assert_eq!(listed(&addr, &pki, "alice"), ["k", "m"]);
    assert_eq!(listed(&addr, &pki, "bob"), ["k"]);
    let bob = write_as(&addr, "k", &pki, "bob");
    assert!(
        bob.contains("read_only True") && bob.contains("write failed EPERM"),
        "{bob}"
    );
    let hidden = run(tool("nbdinfo").arg(uri(&addr, "m", &pki, "bob")));
    assert!(!hidden.status.success(), "{hidden}");
    let info = run(d.cli().args(["cache", "info", "k"]));
    assert!(
        info.stdout.contains("identities alice; read-only bob"),
        "{info}"
    );

    // Changed live: alice's read-write session is closed when she becomes
    // read-only, and the answer says the declaration is not rewritten.
    let mut session = PySession::open(&uri(&addr, "k", &pki, "alice"));
    assert!(session.round_trip());
    let set = run(d
        .cli()
        .args(["access", "k", "--read-only-identity", "alice"]));
    assert!(set.status.success(), "{set}");
    assert!(set.stderr.contains("closed 1 NBD connection"), "{set}");
    assert!(set.stderr.contains("is declared in"), "{set}");
    assert!(set.stdout.contains("k: read-only alice"), "{set}");
    wait_until(
        "alice's session to be closed",
        Duration::from_secs(20),
        || !session.round_trip(),
    );
    let alice = write_as(&addr, "k", &pki, "alice");
    assert!(alice.contains("write failed EPERM"), "{alice}");
    assert_eq!(listed(&addr, &pki, "bob"), Vec::<String>::new());

    // PATCH: one list, bad values, nothing to change.
    let (status, body) = d.http(
        "PATCH",
        "/v1/caches/k",
        Some(r#"{"access": {"allow_networks": ["127.0.0.2/32"]}}"#),
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["access"],
        serde_json::json!({"allow_identities": [], "read_only_identities": ["alice"], "allow_networks": ["127.0.0.2/32"]})
    );
    assert!(connect_from("127.0.0.2", &two, "k", &pki).contains("size 16777216"));
    assert!(connect_from("127.0.0.1", &two, "k", &pki).contains("refused"));
    for bad in [
        r#"{"access": {"allow_networks": ["lan"]}}"#,
        r#"{"access": {"allow_identities": [""]}}"#,
        r#"{"access": {}}"#,
        r#"{}"#,
    ] {
        let (status, body) = d.http("PATCH", "/v1/caches/k", Some(bad));
        assert_eq!(status, 422, "{bad}: {body}");
    }
    let (status, _) = d.http(
        "PATCH",
        "/v1/caches/nosuch",
        Some(r#"{"access": {"allow_networks": []}}"#),
    );
    assert_eq!(status, 404);

    // Created with rules, through the CLI and the API.
    let n = backing("n.img");
    let made = run(d.cli().args([
        "cache",
        "create",
        "n",
        "--backing",
        &n,
        "--size",
        "4M",
        "--mode",
        "writearound",
        "--allow-network",
        "127.0.0.2/32",
    ]));
    assert!(made.status.success(), "{made}");
    assert!(connect_from("127.0.0.2", &two, "n", &pki).contains("size 16777216"));
    assert!(connect_from("127.0.0.1", &two, "n", &pki).contains("refused"));
    let o = backing("o.img");
    let (status, body) = d.http(
        "POST",
        "/v1/caches",
        Some(&format!(
            r#"{{"name": "o", "backing": "{o}", "size": "4M", "mode": "writeback", "access": {{"allow_networks": ["unix", "lan"]}}}}"#
        )),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("invalid_access") && body.contains("'lan' is not a network"),
        "{body}"
    );
    let (status, body) = d.http(
        "POST",
        "/v1/caches",
        Some(&format!(
            r#"{{"name": "o", "backing": "{o}", "size": "4M", "mode": "writeback", "access": {{"allow_identities": ["bob"]}}}}"#
        )),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(listed(&addr, &pki, "bob"), ["o"]);
    assert!(write_as(&addr, "o", &pki, "bob").contains("wrote"));

    // A deleted cache's rules go with it: a drive of its name is open.
    let gone = run(d.cli().args(["cache", "delete", "m"]));
    assert!(gone.status.success(), "{gone}");
    let made = run(d.cli().args(["create", "m", "--size", "1M"]));
    assert!(made.status.success(), "{made}");
    assert_eq!(listed(&addr, &pki, "bob"), ["m", "o"]);
    let shown = run(d.cli().args(["access", "m", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(v["allow_identities"], serde_json::json!([]));
}
