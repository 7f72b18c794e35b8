//! The daemon's side of TLS and of the NBD socket's group (issue 17 items
//! 1 and 3): `ramd daemon` with `--tls-certificates`, `--tls`,
//! `--nbd-socket-group`, reloads by SIGHUP and `ramd tls reload`, driven
//! by real clients (nbdinfo, a libnbd session in Python) and, for the
//! socket group, by users the test creates.
//!
//! Certificates (made by the test with openssl, EC P-256):
//!
//! ```text
//! ca-a  signs  server-a (CN=localhost, SAN localhost + 127.0.0.1)
//! ca-b  signs  server-b (the same names): the certificates after a reload
//! ```
//!
//! The server directories hold no `ca-cert.pem`, so clients need no
//! certificate of their own (client certificates are tests/tls.rs's); a
//! client directory holds only the CA it trusts. A missing tool fails its
//! test; RAMD_SKIP_MISSING_TOOLS=1 skips instead (see `common::require`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::pysession::PySession;
use common::{require, run, tool, try_run, Daemon, SKIP_ENV};

const DRIVE_BYTES: u64 = 64 << 20;

// ------------------------------------------------------------ certificates

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

const SERVER_EXT: &str = "\
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
";

/// The certificates one test uses.
struct Pki {
    root: tempfile::TempDir,
}

impl Pki {
    /// CA `a` and `b`, each with a server certificate.
    fn new() -> Pki {
        let pki = Pki {
            root: tempfile::tempdir().unwrap(),
        };
        for name in ["a", "b"] {
            pki.make(name);
        }
        pki
    }

    fn make(&self, name: &str) {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("server.ext"), SERVER_EXT).unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        let mut args = vec!["req", "-x509"];
        args.extend(ec);
        args.extend(["-nodes", "-keyout", "ca-key.pem", "-out", "ca-cert.pem"]);
        let subj = format!("/CN=ramd test CA {name}");
        args.extend(["-days", "30", "-subj", &subj]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(&dir, &args);
        let mut args = vec!["req", "-new"];
        args.extend(ec);
        args.extend(["-nodes", "-keyout", "server-key.pem", "-out", "server.csr"]);
        args.extend(["-subj", "/CN=localhost"]);
        openssl(&dir, &args);
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-set_serial",
                "4096",
                "-days",
                "30",
                "-extfile",
                "server.ext",
                "-out",
                "server-cert.pem",
            ],
        );
        let client = self.root.path().join(format!("client-{name}"));
        std::fs::create_dir_all(&client).unwrap();
        std::fs::copy(dir.join("ca-cert.pem"), client.join("ca-cert.pem")).unwrap();
    }

    /// Puts the server certificate and key of `name` into `dir` (the
    /// daemon's --tls-certificates).
    fn install(&self, name: &str, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let from = self.root.path().join(name);
        for f in ["server-cert.pem", "server-key.pem"] {
            std::fs::copy(from.join(f), dir.join(f)).unwrap();
        }
    }

    /// A client directory trusting CA `name` only.
    fn client(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("client-{name}"))
    }
}

// ------------------------------------------------------------------ helpers

/// The TCP addresses the daemon listens on (from /v1/health).
fn tcp_addrs(d: &Daemon) -> Vec<String> {
    let (status, body) = d.http("GET", "/v1/health", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["nbd_tcp"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

fn tls_uri(addr: &str, certs: &Path) -> String {
    format!("nbds://{addr}/ram0?tls-certificates={}", certs.display())
}

/// The size nbdinfo reports for `uri`, or its failure output.
fn nbdinfo_size(uri: &str) -> Result<u64, String> {
    let out = run(tool("nbdinfo").args(["--size", uri]));
    if !out.status.success() {
        return Err(out.to_string());
    }
    Ok(out.stdout.trim().parse().expect("a size"))
}

/// A daemon serving `ram0` with TLS from `certs` on a free loopback port.
fn tls_daemon(certs: &Path) -> (Daemon, String) {
    let args: Vec<String> = [
        "daemon",
        "--drive",
        "ram0=64M",
        "--nbd-listen",
        "127.0.0.1:0",
        "--tls-certificates",
        certs.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let d = Daemon::launch(&args, &[]);
    let addr = tcp_addrs(&d).pop().expect("one TCP listener");
    (d, addr)
}

/// Runs `ramd daemon ARGS` expecting it to refuse to start: its output.
fn refused_start(args: &[&str]) -> common::Output {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    let mut cmd = common::ramd();
    cmd.arg("daemon")
        .args(args)
        .args(["--no-config", "--no-default-drive"])
        .args(["--runtime-dir", &p("run"), "--state-dir", &p("state")])
        .args(["--socket", &p("nbd.sock"), "--api-socket", &p("api.sock")]);
    let out = try_run(&mut cmd, Duration::from_secs(30)).unwrap();
    assert_eq!(out.code(), 1, "ramd must refuse to start: {out}");
    assert!(!dir.path().join("nbd.sock").exists(), "no socket left");
    out
}

// ---------------------------------------------------------------- the tests

/// TLS by default with certificates: nbdinfo over nbds:// works, a
/// plaintext client gets no export list; the daemon logs the mode.
#[test]
fn certificates_make_tcp_require_tls() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let pki = Pki::new();
    let certs = pki.root.path().join("live");
    pki.install("a", &certs);
    let (d, addr) = tls_daemon(&certs);
    assert_eq!(
        nbdinfo_size(&tls_uri(&addr, &pki.client("a"))),
        Ok(DRIVE_BYTES)
    );
    let plain = run(tool("nbdinfo").args(["--list", &format!("nbd://{addr}")]));
    assert!(
        !plain.status.success(),
        "plaintext must be refused: {plain}"
    );
    assert!(!plain.stdout.contains("ram0"), "no export list: {plain}");
    // The log says which listeners use TLS.
    let want = format!("NBD on {addr}: TLS require");
    d.wait_log(&want, |l| l.contains(&want));
    // The API shows nbds:// for drives on a TLS-only listener.
    let (_, body) = d.http("GET", "/v1/drives/ram0", None);
    assert!(body.contains(&format!("nbds://{addr}/ram0")), "{body}");
}

/// Plaintext on an address other machines can reach needs --tls off.
#[test]
fn plaintext_on_a_network_address_needs_tls_off() {
    let out = refused_start(&["--nbd-listen", "0.0.0.0:0"]);
    assert!(
        out.stderr
            .contains("refusing to serve NBD in plaintext on 0.0.0.0:0")
            && out.stderr.contains("--tls-certificates")
            && out.stderr.contains("--tls off"),
        "{out}"
    );
    let args: Vec<String> = [
        "daemon",
        "--drive",
        "ram0=16M",
        "--nbd-listen",
        "0.0.0.0:0",
        "--tls",
        "off",
    ]
    .map(String::from)
    .to_vec();
    let d = Daemon::launch(&args, &[]);
    // Written as the listener starts, which may be after the API answers.
    common::wait_until("the plaintext warning", common::WAIT_TIMEOUT, || {
        let log = d.log();
        log.contains("WARN") && log.contains("plaintext and reachable from other machines")
    });
}

/// Bad TLS settings stop the start with a reason.
#[test]
fn bad_tls_settings_refuse_to_start() {
    let empty = tempfile::tempdir().unwrap();
    let out = refused_start(&["--tls-certificates", empty.path().to_str().unwrap()]);
    assert!(
        out.stderr.contains("server-cert.pem") && out.stderr.contains("docs/tls.md"),
        "{out}"
    );
    let out = refused_start(&["--tls", "require"]);
    assert!(out.stderr.contains("needs certificates"), "{out}");
    let out = refused_start(&["--nbd-socket-group", "no-such-group-ramd"]);
    assert!(out.stderr.contains("no such group"), "{out}");
    // A bad value is a usage error (exit 2) naming the choices.
    let out = run(common::ramd().args(["daemon", "--tls", "maybe"]));
    assert_eq!(out.code(), 2, "{out}");
    assert!(out.stderr.contains("off, on or require"), "{out}");
}

/// SIGHUP and `ramd tls reload` swap the certificates for new connections
/// while a running session keeps working; a broken directory keeps the
/// certificates in use and the CLI says why.
#[test]
fn reload_by_sighup_and_cli_keeps_sessions() {
    if !require_openssl()
        || !require(&["nbdinfo", "nbdsh"])
        || !common::require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let pki = Pki::new();
    let certs = pki.root.path().join("live");
    pki.install("a", &certs);
    let (d, addr) = tls_daemon(&certs);
    let mut session = PySession::open(&tls_uri(&addr, &pki.client("a")));
    assert!(session.round_trip());

    // SIGHUP: certificates of CA b for new connections.
    pki.install("b", &certs);
    common::signal(d.pid(), libc::SIGHUP);
    common::wait_until("the SIGHUP reload", Duration::from_secs(20), || {
        d.log().contains("SIGHUP: TLS certificates reloaded")
    });
    assert!(nbdinfo_size(&tls_uri(&addr, &pki.client("a"))).is_err());
    assert_eq!(
        nbdinfo_size(&tls_uri(&addr, &pki.client("b"))),
        Ok(DRIVE_BYTES)
    );
    assert!(session.round_trip(), "the session survived SIGHUP");

    // A broken directory: refused, the certificates of b stay.
    std::fs::write(certs.join("server-key.pem"), "not a key").unwrap();
    let out = run(d.cli().args(["tls", "reload"]));
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stderr.contains("server-key.pem") && out.stderr.contains("kept"),
        "{out}"
    );
    let (status, body) = d.http("POST", "/v1/tls/reload", None);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("tls_reload_failed"), "{body}");
    assert_eq!(
        nbdinfo_size(&tls_uri(&addr, &pki.client("b"))),
        Ok(DRIVE_BYTES)
    );

    // `ramd tls reload`: back to a.
    pki.install("a", &certs);
    let out = run(d.cli().args(["tls", "reload"])).ok();
    assert!(out.stdout.contains("reloaded"), "{out}");
    assert_eq!(
        nbdinfo_size(&tls_uri(&addr, &pki.client("a"))),
        Ok(DRIVE_BYTES)
    );
    assert!(nbdinfo_size(&tls_uri(&addr, &pki.client("b"))).is_err());
    assert!(session.round_trip(), "the session survived the CLI reload");
}

/// Issue 28: an expired or not-yet-valid certificate is refused at reload
/// with its dates while the one in use keeps serving (it used to say
/// "reloaded", then every client failed); at start it is a warning with
/// the dates. A private key its group or others may read is refused, at
/// start and at reload, with the chmod to run.
#[test]
fn out_of_date_certificates_and_open_keys_are_refused_at_reload() {
    use std::os::unix::fs::PermissionsExt;
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let pki = Pki::new();
    let certs = pki.root.path().join("live");
    pki.install("a", &certs);
    let (d, addr) = tls_daemon(&certs);
    let serving = || nbdinfo_size(&tls_uri(&addr, &pki.client("a")));
    assert_eq!(serving(), Ok(DRIVE_BYTES));

    let ca = pki.root.path().join("dated");
    common::pki::make_ca(&ca, "dated CA");
    let cases = [
        (
            "old",
            ("20200101000000Z", "20210101000000Z"),
            "has expired",
            "2021-01-01 00:00:00 UTC",
        ),
        (
            "new",
            ("20990101000000Z", "21000101000000Z"),
            "is not valid yet",
            "2099-01-01 00:00:00 UTC",
        ),
    ];
    for (cn, dates, state, shown) in cases {
        let (cert, key) = common::pki::issue(&ca, cn, "server", Some(dates));
        std::fs::copy(&cert, certs.join("server-cert.pem")).unwrap();
        std::fs::copy(&key, certs.join("server-key.pem")).unwrap();
        let out = run(d.cli().args(["tls", "reload"]));
        assert_eq!(out.code(), 1, "{out}");
        assert!(
            out.stderr.contains(state) && out.stderr.contains(shown) && out.stderr.contains("kept"),
            "{out}"
        );
        let (status, body) = d.http("POST", "/v1/tls/reload", None);
        assert_eq!(status, 422, "{body}");
        common::signal(d.pid(), libc::SIGHUP);
        common::wait_until("the SIGHUP refusal", Duration::from_secs(20), || {
            d.log()
                .lines()
                .any(|l| l.contains("SIGHUP") && l.contains(shown))
        });
        assert_eq!(serving(), Ok(DRIVE_BYTES), "the old certificate serves");
    }
    // At start: a warning with the dates, and the daemon serves.
    let (d2, _) = tls_daemon(&certs);
    let log = d2.wait_log("the dates warning", |l| {
        l.contains("is not valid yet") && l.contains("2099-01-01 00:00:00 UTC")
    });
    assert!(log.contains("notAfter 2100-01-01 00:00:00 UTC"), "{log}");
    drop(d2);

    // A key others may read: refused at reload, with the chmod.
    pki.install("a", &certs);
    let key = certs.join("server-key.pem");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(d.cli().args(["tls", "reload"]));
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stderr
            .contains(&format!("`chmod 600 {}`", key.display())),
        "{out}"
    );
    assert!(!out.stderr.contains("644"), "{out}");
    assert_eq!(serving(), Ok(DRIVE_BYTES));
    // And at start.
    let out = refused_start(&["--tls-certificates", certs.to_str().unwrap()]);
    assert!(
        out.stderr
            .contains(&format!("`chmod 600 {}`", key.display())),
        "{out}"
    );
}

/// Without certificates a reload is a conflict, not a silent success.
#[test]
fn reload_without_certificates_is_refused() {
    let d = Daemon::start(&["ram0=16M"]);
    let (status, body) = d.http("POST", "/v1/tls/reload", None);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("tls_not_configured"), "{body}");
}

// ------------------------------------------------------------ socket group

/// Users and a group made for one test, removed when it ends (even on
/// failure).
struct Accounts {
    group: String,
    users: Vec<String>,
}

impl Accounts {
    fn new(tag: &str) -> Accounts {
        let group = format!("ramdt{tag}{}", std::process::id() % 100_000);
        run(Command::new("groupadd").arg(&group)).ok();
        Accounts {
            group,
            users: Vec::new(),
        }
    }

    /// A user, in the group or not.
    fn user(&mut self, suffix: &str, in_group: bool) -> String {
        let name = format!("{}{suffix}", self.group);
        let mut cmd = Command::new("useradd");
        cmd.args(["-M", "-s", "/usr/sbin/nologin"]);
        if in_group {
            cmd.args(["-G", &self.group]);
        }
        run(cmd.arg(&name)).ok();
        self.users.push(name.clone());
        name
    }
}

impl Drop for Accounts {
    fn drop(&mut self) {
        for u in &self.users {
            let _ = try_run(Command::new("userdel").arg(u), Duration::from_secs(30));
        }
        let _ = try_run(
            Command::new("groupdel").arg(&self.group),
            Duration::from_secs(30),
        );
    }
}

/// `--nbd-socket-group`: the socket is 0660 root:GROUP; a member can use
/// it, another user cannot.
#[test]
fn socket_group_lets_its_members_in() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: needs root (groupadd, useradd, runuser)");
        return;
    }
    if !require(&["nbdinfo"]) {
        return;
    }
    let mut acc = Accounts::new("g");
    let member = acc.user("in", true);
    let stranger = acc.user("out", false);
    let args: Vec<String> = [
        "daemon",
        "--drive",
        "ram0=64M",
        "--nbd-socket-group",
        &acc.group,
    ]
    .map(String::from)
    .to_vec();
    let mut d = Daemon::launch(&args, &[]);
    // A private socket directory (as the 0700 runtime directory): the
    // daemon lets the group through at its next start.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    d.terminate();
    std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d.restart();
    let meta = std::fs::metadata(d.socket()).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o660);
    assert_eq!(meta.uid(), 0);
    let getent = run(Command::new("getent").args(["group", &acc.group])).ok();
    let gid: u32 = getent.stdout.split(':').nth(2).unwrap().parse().unwrap();
    assert_eq!(meta.gid(), gid);
    // The socket's directory (the test's own, 0700) lets the group pass,
    // and nobody else.
    let dir_meta = std::fs::metadata(d.dir()).unwrap();
    assert_eq!(
        dir_meta.mode() & 0o777,
        0o710,
        "the daemon lets its group through"
    );
    assert_eq!(dir_meta.gid(), gid);
    let as_user = |user: &str| {
        let mut cmd = tool("runuser");
        cmd.args(["-u", user, "--", "nbdinfo", "--size", &d.uri("ram0")]);
        run(&mut cmd)
    };
    let ok = as_user(&member).ok();
    assert_eq!(ok.stdout.trim(), DRIVE_BYTES.to_string(), "{ok}");
    let refused = as_user(&stranger);
    assert!(!refused.status.success(), "{refused}");
    assert!(refused.stderr.contains("ermission denied"), "{refused}");
    // Without the flag the socket stays 0600.
    let plain = Daemon::start(&["ram0=16M"]);
    let mode = std::fs::metadata(plain.socket()).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600);
}
