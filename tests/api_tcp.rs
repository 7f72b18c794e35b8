//! The REST API over TCP (issue 17 item 4): `ramd daemon --api-listen`
//! with TLS from `--tls-certificates`, bearer tokens from `ramd token`,
//! driven by curl and by the ramd CLI (`--host`, `--token-file`,
//! `--ca-cert`).
//!
//! Certificates come from tests/common/pki.rs (openssl): CA `a` signs the
//! server certificate the daemon starts with, CA `b` the one a reload
//! brings (both CN=localhost, SAN localhost + 127.0.0.1). The server
//! directory holds no `ca-cert.pem`: the API never asks for client
//! certificates either way. A missing tool fails its test;
//! RAMD_SKIP_MISSING_TOOLS=1 skips instead.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::pki::{issue, make_ca};
use common::{require, try_run, Daemon};
use serde_json::Value;

/// The routes as `api::server::ROUTES` has them, with their parameters
/// filled in (the event stream asked for one event, so it ends).
fn routes() -> Vec<(&'static str, String)> {
    ramd::api::server::ROUTES
        .iter()
        .map(|(m, p)| {
            let path = p.replace("{name}", "ram0").replace("{id}", "1").to_owned();
            let path = if *p == "/v1/events" {
                format!("{path}?count=1")
            } else {
                path
            };
            (*m, path)
        })
        .collect()
}

/// CA `a` and `b` under one directory, each with a server certificate;
/// `server` holds the one the daemon uses (`a`'s to start with).
struct Pki {
    root: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let pki = Pki {
            root: tempfile::tempdir().unwrap(),
        };
        for ca in ["a", "b"] {
            make_ca(&pki.root.path().join(ca), ca);
            issue(&pki.root.path().join(ca), "localhost", "server", None);
        }
        std::fs::create_dir_all(pki.server()).unwrap();
        pki.use_ca("a");
        pki
    }

    /// The daemon's certificates directory.
    fn server(&self) -> PathBuf {
        self.root.path().join("server")
    }

    /// Puts CA `ca`'s server certificate and key in the daemon's directory.
    fn use_ca(&self, ca: &str) {
        let dir = self.root.path().join(ca);
        for (from, to) in [
            ("localhost-cert.pem", "server-cert.pem"),
            ("localhost-key.pem", "server-key.pem"),
        ] {
            std::fs::copy(dir.join(from), self.server().join(to)).unwrap();
        }
    }

    fn ca_cert(&self, ca: &str) -> PathBuf {
        self.root.path().join(ca).join("ca-cert.pem")
    }
}

/// True when curl and openssl are there (else a failure, or a skip).
#[track_caller]
fn tools() -> bool {
    require(&["curl"])
        && (Command::new("openssl").arg("version").output().is_ok()
            || panic!("missing tool openssl: apt-get install openssl"))
}

/// A daemon with the API on 127.0.0.1 (a free port), its TLS CA and port.
struct Remote {
    d: Daemon,
    pki: Option<Pki>,
    port: u16,
}

impl Remote {
    /// TLS with CA `a`'s certificate, `--log debug` so every request is
    /// logged, `extra` flags after.
    fn start(extra: &[&str]) -> Remote {
        let pki = Pki::new();
        let certs = pki.server().to_str().unwrap().to_owned();
        let mut args = vec!["serve", "--drive", "ram0=1M", "--log", "debug"];
        args.extend(["--tls-certificates", &certs, "--api-listen", "127.0.0.1:0"]);
        args.extend(extra);
        Remote::launch(&args, Some(pki))
    }

    fn launch(args: &[&str], pki: Option<Pki>) -> Remote {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let d = Daemon::launch(&args, &[]);
        let port = api_port(&d.wait_log("the API address", |l| l.contains("API also on ")));
        Remote { d, pki, port }
    }

    fn url(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// `ramd token create ROLE --name NAME` over the unix socket: the token.
    fn token(&self, role: &str, name: &str) -> String {
        let out = common::run(self.d.cli().args(["token", "create", role, "--name", name])).ok();
        let token = out.stdout.trim().to_owned();
        assert!(token.starts_with("ramd_"), "{out}");
        token
    }

    /// One request with curl: (status, headers, body).
    fn curl(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Reply {
        self.curl_from("127.0.0.1", method, path, token, body)
    }

    /// [`Remote::curl`] from the loopback address `from` (each address
    /// has its own budget of failed tokens: a few, then one a second).
    fn curl_from(
        &self,
        from: &str,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> Reply {
        let mut c = common::tool("curl");
        c.args(["-sS", "-i", "--interface", from, "-X", method]);
        if let Some(pki) = &self.pki {
            c.arg("--cacert").arg(pki.ca_cert("a"));
        }
        if let Some(t) = token {
            c.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        if let Some(b) = body {
            c.args(["-H", "Content-Type: application/json", "--data", b]);
        }
        c.arg(format!("{}{path}", self.url()));
        let out = common::run(&mut c).ok();
        Reply::parse(&out.stdout)
    }

    /// A `ramd` command aimed at the API over TCP with `token_file`,
    /// trusting CA `a`.
    fn cli(&self, token_file: &Path) -> Command {
        self.cli_trusting(token_file, "a")
    }

    /// [`Remote::cli`] trusting CA `ca`.
    fn cli_trusting(&self, token_file: &Path, ca: &str) -> Command {
        let mut c = common::ramd();
        c.env_remove("RAMD_API_SOCKET")
            .env_remove("RAMD_TOKEN")
            .args(["--host", &self.url()])
            .arg("--token-file")
            .arg(token_file)
            .arg("--api-socket")
            .arg(self.d.dir().join("no-such.sock"));
        if let Some(pki) = &self.pki {
            c.arg("--ca-cert").arg(pki.ca_cert(ca));
        }
        c
    }

    /// `token` in a 0600 file in the daemon's directory.
    fn token_file(&self, token: &str) -> PathBuf {
        let path = self.d.dir().join("client.token");
        std::fs::write(&path, format!("{token}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }
}

/// The port in the daemon's "API also on http(s)://127.0.0.1:PORT" line.
fn api_port(log: &str) -> u16 {
    let line = log
        .lines()
        .find(|l| l.contains("API also on "))
        .unwrap_or_else(|| panic!("no API address in the log:\n{log}"));
    let rest = line.split("://127.0.0.1:").nth(1).expect("an address");
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a port")
}

/// An HTTP answer as curl -i prints it.
struct Reply {
    status: u16,
    headers: String,
    body: String,
}

impl Reply {
    fn parse(text: &str) -> Reply {
        let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        Reply {
            status,
            headers: head.to_ascii_lowercase(),
            body: body.to_owned(),
        }
    }

    fn code(&self) -> String {
        let v: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body));
        v["error"]["code"].as_str().unwrap_or_default().to_owned()
    }
}

// ---------------------------------------------------------------- the tests

/// Every route, and a route that does not exist, answers 401 without a
/// token or with one the daemon never made, with the API's JSON error and
/// a Bearer challenge; a read-only token gets 403 on every route but GET
/// and through on GETs (`/metrics` included).
#[test]
fn every_route_needs_a_token_and_read_only_tokens_only_read() {
    if !tools() {
        return;
    }
    let r = Remote::start(&[]);
    let ro = r.token("--read-only", "ro");
    let bogus = format!("{}x", &ro[..ro.len() - 1]);
    let mut all = routes();
    all.push(("GET", "/v1/nothing".to_owned()));
    for (i, (method, path)) in all.iter().enumerate() {
        let body = (*method != "GET" && *method != "DELETE").then_some("{}");
        // A bad token from an address of its own: one address's guesses
        // are throttled after a few (tests/api_floods.rs).
        let from = format!("127.0.1.{}", i + 1);
        let none = r.curl(method, path, None, body);
        assert_eq!(none.status, 401, "{method} {path}: {}", none.body);
        assert_eq!(none.code(), "token_required", "{method} {path}");
        assert!(
            none.headers.contains("www-authenticate: bearer"),
            "{}",
            none.headers
        );
        let bad = r.curl_from(&from, method, path, Some(&bogus), body);
        assert_eq!(bad.status, 401, "{method} {path}: {}", bad.body);
        assert_eq!(bad.code(), "invalid_token", "{method} {path}");
        assert!(
            bad.headers.contains("error=\"invalid_token\""),
            "{}",
            bad.headers
        );
        let read = r.curl(method, path, Some(&ro), body);
        if *method == "GET" {
            assert!(
                ![401, 403].contains(&read.status),
                "{method} {path}: {}",
                read.body
            );
        } else {
            assert_eq!(read.status, 403, "{method} {path}: {}", read.body);
            assert_eq!(read.code(), "token_read_only", "{method} {path}");
        }
    }
    let metrics = r.curl("GET", "/metrics", Some(&ro), None);
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("ramd_"), "{}", metrics.body);
}

/// An admin token creates and deletes a drive over TCP; token management
/// stays on the unix socket even for admins; a revoked token gets 401.
#[test]
fn admin_tokens_manage_drives_and_revoked_tokens_are_refused() {
    if !tools() {
        return;
    }
    let r = Remote::start(&[]);
    let admin = r.token("--admin", "ops");
    let created = r.curl(
        "POST",
        "/v1/drives",
        Some(&admin),
        Some(r#"{"name":"net","size":"4M"}"#),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    let list = r.curl("GET", "/v1/drives", Some(&admin), None);
    assert!(list.body.contains("\"net\""), "{}", list.body);
    let gone = r.curl("DELETE", "/v1/drives/net", Some(&admin), None);
    assert_eq!(gone.status, 200, "{}", gone.body);

    let mint = r.curl(
        "POST",
        "/v1/tokens",
        Some(&admin),
        Some(r#"{"role":"admin"}"#),
    );
    assert_eq!(mint.status, 403, "{}", mint.body);
    assert_eq!(mint.code(), "unix_socket_only");
    let revoke = r.curl("DELETE", "/v1/tokens/ops", Some(&admin), None);
    assert_eq!(revoke.code(), "unix_socket_only");

    common::run(r.d.cli().args(["token", "revoke", "ops"])).ok();
    let after = r.curl("GET", "/v1/drives", Some(&admin), None);
    assert_eq!(after.status, 401, "{}", after.body);
    assert_eq!(after.code(), "invalid_token");
    let list = common::run(r.d.cli().args(["token", "list", "--json"])).ok();
    let v: Value = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(v["tokens"], serde_json::json!([]));

    // `--expires`: works until then, 401 token_expired after; a bad
    // duration is refused with what to give.
    let bad = common::run(
        r.d.cli()
            .args(["token", "create", "--admin", "--expires", "soon"]),
    )
    .failed();
    assert!(bad.stderr.contains("7d, 12h or 30m"), "{bad}");
    // 10 s: long enough for the token to be used before it expires on a
    // busy machine (a process or two to start), short for the test.
    let out = common::run(r.d.cli().args([
        "token",
        "create",
        "--read-only",
        "--expires",
        "10s",
        "--json",
    ]))
    .ok();
    let made: Value = serde_json::from_str(&out.stdout).unwrap();
    let short = made["token"].as_str().unwrap().to_owned();
    let expires = made["expires_unix_s"].as_u64().unwrap();
    assert!(expires >= made["created_unix_s"].as_u64().unwrap() + 10);
    assert_eq!(r.curl("GET", "/v1/drives", Some(&short), None).status, 200);
    // The behaviour under test: the token expires. Sleep until then by the
    // clock, then poll: the daemon may take a moment more to say so.
    let now_s = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    while now_s() <= expires {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut expired = r.curl("GET", "/v1/drives", Some(&short), None);
    common::wait_until("the token to expire", common::WAIT_TIMEOUT, || {
        if expired.status == 200 {
            expired = r.curl("GET", "/v1/drives", Some(&short), None);
        }
        expired.status != 200
    });
    assert_eq!(
        (expired.status, expired.code().as_str()),
        (401, "token_expired"),
        "{}",
        expired.body
    );
}

/// `ramd --host https://... --ca-cert ... --token-file ... list --json`
/// end to end, and `create`/`delete` with an admin token; a CA that did
/// not sign the daemon's certificate fails with a hint.
#[test]
fn the_cli_talks_to_a_remote_daemon_over_tls() {
    if !tools() {
        return;
    }
    let r = Remote::start(&[]);
    let admin = r.token_file(&r.token("--admin", "cli"));
    let out = common::run(r.cli(&admin).args(["list", "--json"])).ok();
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["drives"][0]["name"], "ram0", "{out}");
    common::run(r.cli(&admin).args(["create", "viatcp", "--size", "2M"])).ok();
    common::run(r.cli(&admin).args(["delete", "viatcp"])).ok();

    let out = common::run(r.cli_trusting(&admin, "b").arg("list")).failed();
    assert!(out.stderr.contains("--ca-cert"), "{out}");
    let out = common::run(r.cli(&admin).args(["token", "create", "--admin"])).failed();
    assert!(out.stderr.contains("unix socket"), "{out}");
    let mut no_token = common::ramd();
    no_token
        .env_remove("RAMD_TOKEN")
        .env_remove("RAMD_TOKEN_FILE");
    let out = common::run(no_token.args(["--host", &r.url(), "list"])).failed();
    assert!(out.stderr.contains("--token-file"), "{out}");
}

/// After new certificates and `ramd tls reload`, new API connections get
/// them: a client trusting only the new CA fails before and works after.
#[test]
fn the_api_picks_up_reloaded_certificates() {
    if !tools() {
        return;
    }
    let r = Remote::start(&[]);
    let token = r.token_file(&r.token("--read-only", "reader"));
    common::run(r.cli_trusting(&token, "b").arg("list")).failed();
    r.pki.as_ref().unwrap().use_ca("b");
    common::run(r.d.cli().args(["tls", "reload"])).ok();
    common::run(r.cli_trusting(&token, "b").arg("list")).ok();
    common::run(r.cli(&token).arg("list")).failed();
}

/// Runs `ramd daemon ARGS` expecting it to refuse to start: its output.
fn refused_start(args: &[&str], state: Option<&Path>) -> common::Output {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    let state = state.map_or(p("state"), |s| s.to_str().unwrap().to_owned());
    let mut cmd = common::ramd();
    cmd.arg("daemon")
        .args(args)
        .args(["--no-config", "--no-default-drive"])
        .args(["--runtime-dir", &p("run"), "--state-dir", &state])
        .args(["--socket", &p("nbd.sock"), "--api-socket", &p("api.sock")]);
    let out = try_run(&mut cmd, Duration::from_secs(30)).unwrap();
    assert_eq!(out.code(), 1, "ramd must refuse to start: {out}");
    assert!(!dir.path().join("api.sock").exists(), "no socket left");
    out
}

/// Plaintext only on loopback and only with `--tls off`; without
/// certificates the error says where to learn to make them.
#[test]
fn plaintext_only_on_loopback_with_tls_off() {
    if !tools() {
        return;
    }
    let out = refused_start(&["--api-listen", "0.0.0.0:0", "--tls", "off"], None);
    assert!(
        out.stderr
            .contains("refusing to serve the API in plaintext"),
        "{out}"
    );
    let out = refused_start(&["--api-listen", "127.0.0.1:0"], None);
    assert!(out.stderr.contains("docs/tls.md"), "{out}");

    let args = [
        "serve",
        "--drive",
        "ram0=1M",
        "--api-listen",
        "127.0.0.1:0",
        "--tls",
        "off",
    ];
    let r = Remote::launch(&args, None);
    assert_eq!(r.curl("GET", "/v1/drives", None, None).status, 401);
    let t = r.token("--read-only", "local");
    assert_eq!(r.curl("GET", "/v1/drives", Some(&t), None).status, 200);
}

/// No token secret reaches the daemon's log, not even one sent in a
/// query string, and the tokens file is 0600; a readable one stops the
/// start with the fix.
#[test]
fn tokens_stay_out_of_the_log_and_their_file_is_private() {
    if !tools() {
        return;
    }
    let r = Remote::start(&[]);
    let admin = r.token("--admin", "a");
    let ro = r.token("--read-only", "b");
    r.curl("GET", "/v1/drives", Some(&admin), None);
    r.curl("POST", "/v1/drives", Some(&ro), Some("{}"));
    r.curl("GET", &format!("/v1/drives?token={ro}"), Some(&ro), None);
    r.curl("GET", &format!("/v1/nothing?token={admin}"), None, None);
    // The last request's line there, every earlier one is.
    let log =
        r.d.wait_log("the last request", |l| l.contains("/v1/nothing"));
    for secret in [&admin, &ro] {
        // ramd_ID_SECRET, the secret in base64url (which may hold '_'
        // itself: a split at the last one could leave two letters that
        // any log line may contain).
        let tail = secret.splitn(3, '_').nth(2).unwrap();
        assert!(tail.len() >= 40, "{secret}");
        assert!(!log.contains(tail), "a token secret is in the log:\n{log}");
    }
    assert!(log.contains("API request"), "requests are logged:\n{log}");

    let file = r.d.state_dir().join("api-tokens.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        !text.contains(admin.splitn(3, '_').nth(2).unwrap()),
        "{text}"
    );

    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::copy(&file, state.path().join("api-tokens.json")).unwrap();
    let copy = state.path().join("api-tokens.json");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = refused_start(&[], Some(state.path()));
    assert!(out.stderr.contains("chmod 600"), "{out}");
}
