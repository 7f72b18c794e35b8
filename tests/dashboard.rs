//! The web dashboard (issue 20, part 2; sessions from issue 28): `ramd
//! daemon --http ADDR` serves the page and the API over TLS with bearer
//! tokens; `ramd dashboard [--admin]` prints a one-time sign-in link for a
//! fresh token, which the page exchanges for a session cookie (a random
//! session id, never the token).
//!
//! - HTTP level, with curl: 401 without a token (an HTML page at `/`,
//!   JSON elsewhere), the code exchange (204 + cookie flags; a code works
//!   once; login CSRF refused), the cookie as a credential and not as a
//!   bearer token, the token not as a cookie, CSRF refusals, read-only
//!   refusals, assets with ETags, logout (ends the session), revocation
//!   (sessions and streams end at once), expiry (`--expires`, 401
//!   `token_expired`, pruning), the server-sent event stream and its
//!   bounds (per token, per address).
//! - Start-up refusals: `--http` off loopback without TLS, on the
//!   `--api-listen` address; `ramd dashboard` without `--http`.
//! - In a real browser (Debian's chromium, headless, through
//!   chromium-driver and selenium; tests/browser/dashboard.py): the
//!   overview lists every drive and cache, the IOPS chart moves when a
//!   drive gets I/O (libnbd writes), an admin link creates, resizes,
//!   syncs, snapshots (to a Garage remote; the job runs to the end) and
//!   deletes drives through the page, a read-only link's create is refused
//!   by the server and the page says so, the token leaves the address
//!   bar, the benchmark section shows a report PUT through the unix
//!   socket, names holding markup are shown as text, the hit ratio chart
//!   plots a page opened after the I/O, a revoked session's page goes offline
//!   and says so without a reload, an expiring link's page says the
//!   session expired. Screenshots go to target/test-output/dashboard/.
//!
//! Certificates come from tests/common/pki.rs (openssl; CN=localhost,
//! SAN 127.0.0.1); chromium trusts the server certificate by its SPKI
//! hash for the run (--ignore-certificate-errors-spki-list), nothing
//! else. A missing tool fails its test; RAMD_SKIP_MISSING_TOOLS=1 skips.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::openapi::Spec;
use common::pki::server_dir;
use common::{require, require_python_module, Daemon};
use serde_json::{json, Value};

/// The daemon under test: TLS, `--http` on a free loopback port, a
/// plain, a compressed and a persistent drive, and a write-back cache.
struct Dash {
    d: Daemon,
    /// The CA and the server's certificates directory.
    pki: tempfile::TempDir,
    port: u16,
}

/// The drives, as the API sorts them.
const DRIVES: [&str; 3] = ["keep", "plain", "zip"];
const CACHE: &str = "c1";
/// Markup in names the user controls (a cache's backing file, a bench
/// target's path): the page must show it as text, never parse it.
/// (No `/`: it is also a file name.)
const MARKUP: &str = "<img src=x onerror=\"window.pwned=1\"><b>b";

impl Dash {
    fn start() -> Dash {
        let pki = tempfile::tempdir().unwrap();
        let server = server_dir(pki.path(), "dashboard-test-ca");
        let args = [
            "serve",
            "--drive",
            "plain=64M",
            "--drive",
            "zip=64M,compress=lz4",
            "--drive",
            "keep=32M,persist,durability=periodic,sync-interval=1h",
            "--tls-certificates",
            server.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
            "--log",
            "debug",
        ];
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let d = Daemon::launch(&args, &[]);
        let port = dashboard_port(&dashboard_line(&d), "https");
        let dash = Dash { d, pki, port };
        dash.add_cache();
        dash
    }

    /// A write-back cache over a 32 MiB file in the daemon's directory,
    /// named with markup ([`MARKUP`]): the page must show it as text.
    fn add_cache(&self) {
        let backing = self.d.dir().join(format!("{MARKUP}.img"));
        std::fs::File::create(&backing)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let out = common::run(
            self.d
                .cli()
                .args(["cache", "create", CACHE, "--backing"])
                .arg(&backing)
                .args(["--size", "16M", "--mode", "writeback"]),
        );
        assert!(out.status.success(), "{out}");
    }

    fn base(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn ca_cert(&self) -> PathBuf {
        self.pki.path().join("ca").join("ca-cert.pem")
    }

    /// `ramd dashboard [--admin]`: its last line, the URL.
    fn link(&self, admin: bool) -> String {
        let mut c = self.d.cli();
        c.arg("dashboard");
        if admin {
            c.arg("--admin");
        }
        let out = common::run(&mut c).ok();
        let url = out.stdout.lines().last().unwrap_or("").trim().to_owned();
        assert!(
            url.starts_with(&format!("{}/signin#", self.base())),
            "{out}"
        );
        assert!(!url.contains("ramd_"), "a token in the link: {url}");
        assert!(out.stderr.contains("ramd token revoke dashboard-"), "{out}");
        url
    }

    /// What the sign-in page does with `url`: POST its code to /session.
    fn exchange(&self, url: &str, extra: &[&str]) -> Reply {
        let body = json!({ "code": code_of(url) }).to_string();
        let mut args = vec![
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "-H",
            "X-Ramd-Csrf: 1",
            "--data",
            &body,
        ];
        args.extend(extra);
        self.curl(&args, "/session")
    }

    /// A session from a new link (`admin` or read-only): its id.
    fn session(&self, admin: bool) -> String {
        let ex = self.exchange(&self.link(admin), &[]);
        assert_eq!(ex.status, 204, "{}", ex.body);
        session_of(&ex, &self.cookie_name())
    }

    /// The session cookie's name on this (TLS) listener.
    fn cookie_name(&self) -> String {
        format!("__Host-ramd_{}", self.port)
    }

    /// `ramd token create [--admin]`: a bearer token.
    fn token(&self, admin: bool) -> String {
        let role = if admin { "--admin" } else { "--read-only" };
        let out = common::run(self.d.cli().args(["token", "create", role])).ok();
        let token = out.stdout.trim().to_owned();
        assert!(token.starts_with("ramd_"), "{out}");
        token
    }

    /// curl -i with the test CA: (status, headers, body).
    fn curl(&self, args: &[&str], path: &str) -> Reply {
        let mut c = common::tool("curl");
        c.args(["-sS", "-i", "--cacert"]).arg(self.ca_cert());
        c.args(args).arg(format!("{}{path}", self.base()));
        Reply::parse(&common::run(&mut c).ok().stdout)
    }

    /// curl with the session cookie `session` (as a browser sends it).
    fn with_cookie(&self, session: &str, args: &[&str], path: &str) -> Reply {
        let cookie = format!("Cookie: other=1; {}={session}", self.cookie_name());
        let mut all = vec!["-H", cookie.as_str()];
        all.extend(args);
        self.curl(&all, path)
    }

    /// The server certificate's SPKI SHA-256, base64 (what chromium's
    /// --ignore-certificate-errors-spki-list takes).
    fn spki(&self) -> String {
        let cert = self.pki.path().join("server").join("server-cert.pem");
        let script = format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64",
            cert.display()
        );
        let out = common::run(Command::new("sh").args(["-c", &script])).ok();
        out.stdout.trim().to_owned()
    }
}

/// A daemon with drive `a` and the dashboard in plaintext on loopback
/// (`--http 127.0.0.1:0 --tls off`), and the dashboard's port.
fn plaintext_daemon() -> (Daemon, u16) {
    let d = Daemon::launch(
        &[
            "serve",
            "--drive",
            "a=1M",
            "--http",
            "127.0.0.1:0",
            "--tls",
            "off",
        ]
        .map(String::from),
        &[],
    );
    let port = dashboard_port(&dashboard_line(&d), "http");
    (d, port)
}

/// The daemon's log once it has its "Dashboard and API on" line.
fn dashboard_line(d: &Daemon) -> String {
    d.wait_log("the dashboard address", |l| {
        l.contains("Dashboard and API on ")
    })
}

/// The port of the daemon's "Dashboard and API on SCHEME://127.0.0.1:PORT" line.
fn dashboard_port(log: &str, scheme: &str) -> u16 {
    let line = log
        .lines()
        .find(|l| l.contains("Dashboard and API on "))
        .unwrap_or_else(|| panic!("no dashboard address in the log:\n{log}"));
    let rest = line
        .split(&format!("{scheme}://127.0.0.1:"))
        .nth(1)
        .unwrap_or_else(|| panic!("not {scheme}: {line}"));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a port")
}

/// The sign-in code in a dashboard link (after `#`).
fn code_of(url: &str) -> String {
    url.split_once('#').expect("a code").1.to_owned()
}

/// The session id the exchange's `Set-Cookie` named `name` holds.
fn session_of(ex: &Reply, name: &str) -> String {
    let cookie = ex.raw_header("set-cookie").expect("a session cookie");
    let value = cookie
        .strip_prefix(&format!("{name}="))
        .unwrap_or_else(|| panic!("not {name}: {cookie}"));
    value.split(';').next().unwrap().to_owned()
}

/// An HTTP answer as curl -i prints it (the last response).
struct Reply {
    status: u16,
    headers: String,
    /// The headers as sent (cookie values are case-sensitive).
    raw: String,
    body: String,
}

impl Reply {
    fn parse(text: &str) -> Reply {
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {text:?}"));
        Reply {
            status,
            headers: head.to_ascii_lowercase(),
            raw: head.to_owned(),
            body: body.to_owned(),
        }
    }

    /// The value of header `name` (lowercase) as sent.
    fn raw_header(&self, name: &str) -> Option<String> {
        self.raw
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with(&format!("{name}: ")))
            .map(|l| l[name.len() + 2..].trim().to_owned())
    }

    /// The value of header `name` (lowercase).
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .map(|v| v.trim().to_owned())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: not JSON: {}", self.body))
    }

    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

#[test]
fn links_cookies_csrf_and_roles() {
    if !require(&["curl", "openssl"]) {
        return;
    }
    let dash = Dash::start();

    // Without a token: the page explains, the API answers JSON, the
    // assets are not served.
    let page = dash.curl(&[], "/");
    assert_eq!(page.status, 401, "{}", page.body);
    assert!(page.body.contains("ramd dashboard"), "{}", page.body);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    let api = dash.curl(&[], "/v1/drives");
    assert_eq!((api.status, api.code().as_str()), (401, "token_required"));
    assert_eq!(dash.curl(&[], "/assets/app.js").status, 401);
    // An old-style link with a token in its query: only the sign-in
    // page's refusal, no cookie.
    let bad = dash.curl(&[], "/?token=ramd_000000000000_nope");
    assert_eq!(bad.status, 401);
    assert!(bad.header("set-cookie").is_none());

    // The sign-in page needs no credential and carries no code itself.
    let signin = dash.curl(&[], "/signin");
    assert_eq!(signin.status, 200, "{}", signin.body);
    assert!(signin.body.contains("/assets/signin.js"), "{}", signin.body);
    assert_eq!(dash.curl(&[], "/assets/signin.js").status, 200);
    assert_eq!(dash.curl(&[], "/assets/app.js").status, 401);

    // The exchange: the code of a link, once, for a session cookie.
    let ro_url = dash.link(false);
    // Without the CSRF header, or from another site (login CSRF): refused.
    let body = json!({ "code": code_of(&ro_url) }).to_string();
    let forged = dash.curl(
        &[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data",
            &body,
        ],
        "/session",
    );
    assert_eq!(
        (forged.status, forged.code().as_str()),
        (403, "csrf_refused")
    );
    let cross = dash.exchange(&ro_url, &["-H", "Origin: https://evil.example"]);
    assert_eq!((cross.status, cross.code().as_str()), (403, "csrf_refused"));
    let cross = dash.exchange(&ro_url, &["-H", "Sec-Fetch-Site: cross-site"]);
    assert_eq!(cross.status, 403);
    assert!(cross.header("set-cookie").is_none());
    // From the page itself: a session.
    let ex = dash.exchange(&ro_url, &["-H", &format!("Origin: {}", dash.base())]);
    assert_eq!(ex.status, 204, "{}", ex.body);
    let cookie = ex.header("set-cookie").expect("a session cookie");
    let name = dash.cookie_name();
    for flag in [
        "httponly",
        "samesite=strict",
        "secure",
        "path=/",
        "max-age=",
    ] {
        assert!(cookie.contains(flag), "{flag} missing: {cookie}");
    }
    assert!(!cookie.contains("domain="), "{cookie}");
    let ro = session_of(&ex, &name);
    assert_eq!(ro.len(), 43, "256 random bits: {ro}");
    assert!(!ro.contains(&code_of(&ro_url)));
    assert_eq!(ex.header("referrer-policy").as_deref(), Some("no-referrer"));
    // A code works once.
    let twice = dash.exchange(&ro_url, &[]);
    assert_eq!((twice.status, twice.code().as_str()), (401, "code_invalid"));
    assert!(twice.body.contains("ramd dashboard"), "{}", twice.body);
    assert!(twice.header("set-cookie").is_none());

    // The cookie is a credential: the page, its assets, the API.
    let index = dash.with_cookie(&ro, &[], "/");
    assert_eq!(index.status, 200);
    assert!(index.body.contains("/assets/app.js"));
    let csp = index.header("content-security-policy").unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    assert!(
        !index.body.contains("<script>"),
        "inline script in the page"
    );
    assert_eq!(index.header("cache-control").as_deref(), Some("no-store"));
    let js = dash.with_cookie(&ro, &[], "/assets/app.js");
    assert_eq!(js.status, 200);
    assert!(js
        .header("content-type")
        .unwrap()
        .starts_with("text/javascript"));
    let etag = js.header("etag").expect("an ETag");
    let again = dash.with_cookie(
        &ro,
        &["-H", &format!("If-None-Match: {etag}")],
        "/assets/app.js",
    );
    assert_eq!(again.status, 304);
    assert_eq!(dash.with_cookie(&ro, &[], "/assets/nope.js").status, 404);
    let me = dash.with_cookie(&ro, &[], "/v1/whoami").json();
    assert_eq!(me["via"], "cookie");
    assert_eq!(me["role"], "read-only");
    let drives = dash.with_cookie(&ro, &[], "/v1/drives").json();
    let names: Vec<&str> = drives["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), DRIVES.len(), "{names:?}");

    // A read-only session changes nothing, CSRF header or not.
    let body = r#"{"name":"x1","size":"1M"}"#;
    let json_post = [
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
        body,
    ];
    let refused = dash.with_cookie(
        &ro,
        &[&json_post[..], &["-H", "X-Ramd-Csrf: 1"]].concat(),
        "/v1/drives",
    );
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (403, "token_read_only")
    );

    // The session id is not a bearer token, and a token is not a session
    // (what another web service on this host would receive as a cookie).
    let as_bearer = dash.curl(
        &["-H", &format!("Authorization: Bearer {ro}")],
        "/v1/drives",
    );
    assert_eq!(
        (as_bearer.status, as_bearer.code().as_str()),
        (401, "invalid_token")
    );
    let ro_token = dash.token(false);
    let as_cookie = dash.with_cookie(&ro_token, &[], "/v1/drives");
    assert_eq!(
        (as_cookie.status, as_cookie.code().as_str()),
        (401, "session_ended")
    );

    // An admin session: changes need the CSRF header and the same origin.
    let admin = dash.session(true);
    let admin_token = dash.token(true);
    let no_header = dash.with_cookie(&admin, &json_post, "/v1/drives");
    assert_eq!(
        (no_header.status, no_header.code().as_str()),
        (403, "csrf_refused")
    );
    let evil = ["-H", "X-Ramd-Csrf: 1", "-H", "Origin: https://evil.example"];
    let cross = dash.with_cookie(&admin, &[&json_post[..], &evil].concat(), "/v1/drives");
    assert_eq!((cross.status, cross.code().as_str()), (403, "csrf_refused"));
    let site = ["-H", "X-Ramd-Csrf: 1", "-H", "Sec-Fetch-Site: cross-site"];
    let cross_site = dash.with_cookie(&admin, &[&json_post[..], &site].concat(), "/v1/drives");
    assert_eq!(cross_site.status, 403);
    let origin = format!("Origin: {}", dash.base());
    let same = [
        "-H",
        "X-Ramd-Csrf: 1",
        "-H",
        &origin,
        "-H",
        "Sec-Fetch-Site: same-origin",
    ];
    let made = dash.with_cookie(&admin, &[&json_post[..], &same].concat(), "/v1/drives");
    assert_eq!(made.status, 201, "{}", made.body);
    // A bearer header needs no CSRF header (browsers never add one).
    let bearer = format!("Authorization: Bearer {admin_token}");
    let gone = dash.curl(&["-X", "DELETE", "-H", &bearer], "/v1/drives/x1");
    assert_eq!(gone.status, 200, "{}", gone.body);
    // Links are made through the unix socket only, even by an admin.
    let link = dash.curl(
        &[
            "-X",
            "POST",
            "-H",
            &bearer,
            "-H",
            "Content-Type: application/json",
            "--data",
            "{}",
        ],
        "/v1/dashboard/links",
    );
    assert_eq!(
        (link.status, link.code().as_str()),
        (403, "unix_socket_only")
    );
    let spec = Spec::load();
    let (_, me) = spec.call(&dash.d, "GET", "/v1/whoami", "/v1/whoami", None);
    assert_eq!(
        (me["via"].as_str(), me["role"].as_str()),
        (Some("unix_socket"), Some("admin"))
    );
    let body = Some(r#"{"admin": true, "host": "localhost"}"#);
    let (status, link) = spec.call(
        &dash.d,
        "POST",
        "/v1/dashboard/links",
        "/v1/dashboard/links",
        body,
    );
    assert_eq!(status, 201);
    assert_eq!(
        link["base_url"],
        format!("https://localhost:{}/", dash.port)
    );
    let (status, bad) = spec.call(
        &dash.d,
        "POST",
        "/v1/dashboard/links",
        "/v1/dashboard/links",
        Some(r#"{"host": "a b"}"#),
    );
    assert_eq!(
        (status, bad["error"]["code"].as_str()),
        (422, Some("invalid_host"))
    );
    let (status, _) = spec.call(
        &dash.d,
        "POST",
        "/v1/dashboard/links",
        "/v1/dashboard/links",
        Some(r#"{"admn": true}"#),
    );
    assert_eq!(status, 400);
    spec.check(
        "GET",
        "/v1/whoami",
        200,
        &dash.with_cookie(&ro, &[], "/v1/whoami").body,
    );

    // Signing out ends the session and clears the cookie, for any
    // session: a read-only one (which may not POST elsewhere) and one
    // that is gone (its stale cookie would stay), from the page itself
    // (the CSRF rule).
    let sign_out = ["-X", "POST", "-H", "X-Ramd-Csrf: 1"];
    let forced = dash.with_cookie(&ro, &["-X", "POST"], "/logout");
    assert_eq!(
        (forced.status, forced.code().as_str()),
        (403, "csrf_refused")
    );
    assert!(forced.header("set-cookie").is_none());
    let me = dash.with_cookie(&ro, &[], "/v1/whoami").json();
    let ro_name = me["token_name"].as_str().unwrap().to_owned();
    assert!(ro_name.starts_with("dashboard-"), "{me}");
    for session in [admin.as_str(), ro.as_str(), "gone"] {
        let out = dash.with_cookie(session, &sign_out, "/logout");
        assert_eq!(out.status, 204, "{session}: {}", out.body);
        assert!(out.header("set-cookie").unwrap().contains("max-age=0"));
    }
    let ended = dash.with_cookie(&admin, &[], "/v1/drives");
    assert_eq!(
        (ended.status, ended.code().as_str()),
        (401, "session_ended")
    );
    // Revoking a token ends its sessions at once.
    let ro2 = dash.session(false);
    let me = dash.with_cookie(&ro2, &[], "/v1/whoami").json();
    let name2 = me["token_name"].as_str().unwrap().to_owned();
    common::run(dash.d.cli().args(["token", "revoke", &name2])).ok();
    let ended = dash.with_cookie(&ro2, &[], "/v1/drives");
    assert_eq!(
        (ended.status, ended.code().as_str()),
        (401, "session_ended")
    );
    assert_eq!(dash.with_cookie(&ro2, &[], "/").status, 401);

    // Neither tokens nor session ids nor codes reach the log.
    let log = dash.d.wait_log("the session's start", |l| {
        l.contains("dashboard session started")
    });
    for secret in [&ro, &admin, &admin_token, &ro_token, &code_of(&ro_url)] {
        assert!(!log.contains(secret.as_str()), "a secret in the log");
    }
}

/// Checks `instance` against the schema `name` of docs/openapi.yaml.
#[track_caller]
fn check_schema(spec: &Spec, name: &str, instance: &Value) {
    let root = json!({
        "$ref": format!("#/components/schemas/{name}"),
        "components": spec.doc["components"],
    });
    let validator = jsonschema::draft202012::new(&root).expect("the schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{name}: {}
{instance}",
        errors.join("\n")
    );
}

/// The `event: stats` blocks of an SSE text, as JSON.
fn stats_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|block| block.lines().any(|l| l == "event: stats"))
        .map(|block| {
            let data = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("a data line");
            serde_json::from_str(data).expect("JSON data")
        })
        .collect()
}

#[test]
fn event_stream() {
    if !require(&["curl", "openssl"]) {
        return;
    }
    let dash = Dash::start();
    let session = dash.session(false);
    let cookie = format!("{}={session}", dash.cookie_name());
    // Three events, then the stream ends (count=3).
    let mut c = common::tool("curl");
    c.args(["-sS", "-N", "--cacert"])
        .arg(dash.ca_cert())
        .args(["-b", &cookie])
        .arg(format!("{}/v1/events?interval_ms=250&count=3", dash.base()));
    let out = common::run(&mut c).ok();
    let events = stats_events(&out.stdout);
    assert_eq!(events.len(), 3, "{}", out.stdout);
    let spec = Spec::load();
    for (i, e) in events.iter().enumerate() {
        check_schema(&spec, "StatsEvent", e);
        assert_eq!(e["seq"], i as u64, "{e}");
        assert!(e["unix_ms"].as_u64().unwrap() > 0);
        let drives: Vec<&str> = e["stats"]["drives"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(drives, DRIVES, "{e}");
        assert_eq!(e["stats"]["caches"][0]["name"], CACHE);
        assert_eq!(
            e["stats"]["drives"][0]["persist"]["sync_state"], "idle",
            "{e}"
        );
        assert_eq!(
            e["stats"]["drives"][2]["compression"]["algorithm"], "lz4",
            "{e}"
        );
    }
    assert!(out.stdout.contains("retry: 3000"), "{}", out.stdout);

    // A stream ends, with an `ended` event, when its session does
    // (signed out) and when its token is revoked: a page never stays
    // "live" on a credential that is gone.
    let follow = |cookie: &str, file: &str| {
        let out = dash.d.dir().join(file);
        let mut c = common::tool("curl");
        c.args(["-sS", "-N", "-o"])
            .arg(&out)
            .arg("--cacert")
            .arg(dash.ca_cert())
            .args(["-b", cookie])
            .arg(format!("{}/v1/events?interval_ms=250", dash.base()));
        let child = common::KillOnDrop(c.spawn().unwrap());
        common::wait_until("the stream's first event", common::WAIT_TIMEOUT, || {
            std::fs::read_to_string(&out).is_ok_and(|t| t.contains("event: stats"))
        });
        (child, out)
    };
    let (mut signed_out, out1) = follow(&cookie, "ended-1.txt");
    let other = dash.session(false);
    let (mut revoked, out2) = follow(&format!("{}={other}", dash.cookie_name()), "ended-2.txt");
    let bye = dash.with_cookie(&session, &["-X", "POST", "-H", "X-Ramd-Csrf: 1"], "/logout");
    assert_eq!(bye.status, 204);
    let me = dash.with_cookie(&other, &[], "/v1/whoami").json();
    let name = me["token_name"].as_str().unwrap().to_owned();
    common::run(dash.d.cli().args(["token", "revoke", &name])).ok();
    for (child, out) in [(&mut signed_out, &out1), (&mut revoked, &out2)] {
        let ended = common::wait_timeout(&mut child.0, common::WAIT_TIMEOUT);
        assert!(ended.is_some(), "the stream outlived its credential");
        let text = std::fs::read_to_string(out).unwrap();
        assert!(text.contains("event: ended"), "{text}");
    }

    // Bounds: at most 8 streams per token and 8 per client address (the
    // second address is 127.0.0.2, also loopback); a stream that closes
    // gives its place back.
    let a = dash.token(false);
    let b = dash.token(false);
    let probe = |token: &str, from: &str| {
        let mut c = common::tool("curl");
        c.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(dash.ca_cert())
            .args(["--interface", from])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("{}/v1/events?count=1", dash.base()));
        common::run(&mut c).ok().stdout
    };
    let outputs: Vec<_> = (0..8)
        .map(|i| dash.d.dir().join(format!("stream-{i}.txt")))
        .collect();
    let mut open: Vec<_> = outputs
        .iter()
        .map(|out| {
            let mut c = common::tool("curl");
            c.args(["-sS", "-N", "-o"])
                .arg(out)
                .arg("--cacert")
                .arg(dash.ca_cert())
                .args(["--interface", "127.0.0.1"])
                .args(["-H", &format!("Authorization: Bearer {a}")])
                .arg(format!("{}/v1/events", dash.base()));
            common::KillOnDrop(c.spawn().unwrap())
        })
        .collect();
    // Every stream open: each has had its first event (eight TLS clients
    // can take a while on a busy machine; probing meanwhile would only
    // add a ninth).
    common::wait_until("8 streams open on one token", common::WAIT_TIMEOUT, || {
        outputs
            .iter()
            .all(|out| std::fs::read_to_string(out).is_ok_and(|t| t.contains("event: stats")))
    });
    assert_eq!(probe(&a, "127.0.0.2"), "503", "a ninth stream on the token");
    assert_eq!(
        probe(&b, "127.0.0.1"),
        "503",
        "a ninth stream from the address"
    );
    assert_eq!(
        probe(&b, "127.0.0.2"),
        "200",
        "another token, another address"
    );
    drop(open.pop());
    common::wait_until("a closed stream's place", common::WAIT_TIMEOUT, || {
        probe(&a, "127.0.0.1") == "200"
    });
    drop(open);
    // Over the unix socket too, and bad queries are refused.
    let (status, one) = common::http(dash.d.api_socket(), "GET", "/v1/events?count=1", None);
    assert_eq!(status, 200);
    assert_eq!(stats_events(&one).len(), 1, "{one}");
    for q in ["interval_ms=5", "interval_ms=x", "count=0", "every=1"] {
        let (status, body) =
            common::http(dash.d.api_socket(), "GET", &format!("/v1/events?{q}"), None);
        assert_eq!(status, 400, "{q}: {body}");
    }
    // Without a session, nothing.
    let mut c = common::tool("curl");
    c.args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(dash.ca_cert())
        .arg(format!("{}/v1/events", dash.base()));
    assert_eq!(common::run(&mut c).ok().stdout, "401");
    // A daemon with an open stream still stops (the stream ends).
    let streamed = dash.d.dir().join("stream.txt");
    let mut c = common::tool("curl");
    c.args(["-sS", "-N", "--unix-socket"])
        .arg(dash.d.api_socket())
        .arg("http://ramd/v1/events")
        .stdout(std::fs::File::create(&streamed).unwrap());
    let mut stream = common::KillOnDrop(c.spawn().unwrap());
    common::wait_until("the stream's first event", common::WAIT_TIMEOUT, || {
        std::fs::read_to_string(&streamed).is_ok_and(|t| t.contains("event: stats"))
    });
    let mut dash = dash;
    let status = dash.d.terminate();
    assert!(status.success(), "{status}: {}", dash.d.log());
    let ended = common::wait_timeout(&mut stream.0, common::WAIT_TIMEOUT);
    assert!(ended.is_some(), "the event stream outlived the daemon");
}

#[test]
fn refused_at_start_and_without_http() {
    if !require(&["curl"]) {
        return;
    }
    // Plaintext on a network address, and --http on --api-listen's address.
    for args in [
        &["--http", "0.0.0.0:0", "--tls", "off"][..],
        &[
            "--http",
            "127.0.0.1:18443",
            "--api-listen",
            "127.0.0.1:18443",
            "--tls",
            "off",
        ][..],
        &["--http", "127.0.0.1:0"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = common::run(
            common::ramd()
                .args(["serve", "--no-config", "--drive", "a=1M"])
                .arg("--runtime-dir")
                .arg(dir.path())
                .arg("--state-dir")
                .arg(dir.path().join("state"))
                .args(args),
        );
        assert_eq!(out.code(), 1, "{args:?}: {out}");
        assert!(
            out.stderr.contains("--http") || out.stderr.contains("--tls"),
            "{args:?}: {out}"
        );
    }
    // Plaintext on loopback with --tls off: an http:// link, a cookie
    // without Secure (and so without the __Host- prefix, which needs it).
    let (d, port) = plaintext_daemon();
    let out = common::run(d.cli().arg("dashboard")).ok();
    let url = out.stdout.trim();
    assert!(
        url.starts_with(&format!("http://127.0.0.1:{port}/signin#")),
        "{out}"
    );
    let ex = plain_exchange(port, url);
    assert_eq!(ex.status, 204, "{}", ex.body);
    let cookie = ex.header("set-cookie").unwrap();
    assert!(
        cookie.starts_with(&format!("ramd_session_{port}=")) && !cookie.contains("secure"),
        "{cookie}"
    );
    // --url-host names the host in the link; a bad one is refused.
    let out = common::run(
        d.cli()
            .args(["dashboard", "--url-host", "db1.example.com", "--json"]),
    )
    .ok();
    let link: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(link["base_url"], format!("http://db1.example.com:{port}/"));
    assert_eq!(link["role"], "read-only");
    let out = common::run(d.cli().args(["dashboard", "--url-host", "a/b"]));
    assert_eq!(out.code(), 1, "{out}");
    // A daemon without --http says how to get one.
    let plain = Daemon::start(&["a=1M"]);
    let out = common::run(plain.cli().arg("dashboard"));
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("--http ADDR"), "{out}");
    let path = "/v1/dashboard/links";
    let (status, e) = Spec::load().call(&plain, "POST", path, path, Some("{}"));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("dashboard_off"))
    );
}

/// Dashboard links expire (7 days unless `--expires` says otherwise): an
/// expired token is refused with 401 `token_expired` (an HTML page at /,
/// for the link and for the cookie), the cookie lives no longer than the
/// token, and the next token made deletes it.
#[test]
fn links_expire() {
    if !require(&["curl"]) {
        return;
    }
    let (d, port) = plaintext_daemon();
    let link = |args: &[&str]| -> Value {
        let out = common::run(d.cli().arg("dashboard").args(args).arg("--json")).ok();
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = now();
    let weekly = link(&[]);
    let week = weekly["expires_unix_s"].as_u64().expect("an expiry");
    assert!(
        (before + 7 * 86400..=now() + 7 * 86400).contains(&week),
        "{week}"
    );
    assert_eq!(link(&["--expires", "never"])["expires_unix_s"], Value::Null);
    let out = common::run(d.cli().args(["dashboard", "--expires", "0s"]));
    assert_eq!(out.code(), 2, "{out}");
    let path = "/v1/dashboard/links";
    let (status, e) = Spec::load().call(&d, "POST", path, path, Some(r#"{"expires": "soon"}"#));
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (422, Some("invalid_expires"))
    );

    // 10 s: long enough for the link to be used before it expires on a
    // busy machine (a process or two to start), short for the test.
    let short = link(&["--expires", "10s"]);
    let late = link(&["--expires", "10s"]);
    let url = short["url"].as_str().unwrap();
    let name = short["token_name"].as_str().unwrap().to_owned();
    let until = short["sign_in_expires_unix_s"].as_u64().unwrap();
    assert!((before + 290..=now() + 300).contains(&until), "{until}");
    let curl = |args: &[&str], url: &str| {
        let mut c = common::tool("curl");
        c.args(["-sS", "-i"]).args(args).arg(url);
        Reply::parse(&common::run(&mut c).ok().stdout)
    };
    let ex = plain_exchange(port, url);
    assert_eq!(ex.status, 204, "{}", ex.body);
    let max_age: u64 = ex
        .header("set-cookie")
        .unwrap()
        .split("max-age=")
        .nth(1)
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.trim().parse().ok())
        .expect("a Max-Age");
    assert!(max_age <= 10, "the cookie outlives the token: {max_age}");
    let session = session_of(&ex, &format!("ramd_session_{port}"));
    let cookie = format!("Cookie: ramd_session_{port}={session}");
    let base = format!("http://127.0.0.1:{port}");
    let api = |path: &str| curl(&["-H", &cookie], &format!("{base}{path}"));
    // The behaviour under test: the token expires. Sleep until then by the
    // clock, then poll: the daemon may take a moment more to say so.
    let expires = short["expires_unix_s"].as_u64().expect("an expiry");
    let late_expires = late["expires_unix_s"].as_u64().expect("an expiry");
    while now() <= expires.max(late_expires) {
        std::thread::sleep(Duration::from_millis(200));
    }
    common::wait_until("the link's token to expire", common::WAIT_TIMEOUT, || {
        api("/v1/whoami").status == 401
    });
    let refused = api("/v1/whoami");
    assert_eq!(refused.code(), "token_expired", "{}", refused.body);
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("ramd dashboard"));
    let page = api("/");
    assert_eq!(page.status, 401);
    assert!(page.body.contains("expired"), "{}", page.body);
    // A link whose token expired before it was used starts nothing.
    let again = plain_exchange(port, late["url"].as_str().unwrap());
    assert_eq!((again.status, again.code().as_str()), (401, "code_invalid"));
    assert!(again.body.contains("expired"), "{}", again.body);
    assert!(again.header("set-cookie").is_none());
    // whoami tells the page when its session ends.
    let weekly_ex = plain_exchange(port, weekly["url"].as_str().unwrap());
    let weekly_session = session_of(&weekly_ex, &format!("ramd_session_{port}"));
    let weekly_cookie = format!("Cookie: ramd_session_{port}={weekly_session}");
    let me = curl(&["-H", &weekly_cookie], &format!("{base}/v1/whoami")).json();
    assert_eq!(me["expires_unix_s"], week, "{me}");
    let list = common::run(d.cli().args(["token", "list"])).ok();
    let row = list.stdout.lines().find(|l| l.contains(&name)).unwrap();
    assert!(row.contains("(expired)"), "{list}");

    // The next token made deletes it: the session is gone from then on.
    link(&[]);
    let list = common::run(d.cli().args(["token", "list", "--json"])).ok();
    assert!(!list.stdout.contains(&name), "{list}");
    assert!(list.stdout.contains("expires_unix_s"), "{list}");
    assert_eq!(api("/v1/whoami").code(), "session_ended");
    assert!(!d.log().contains(&code_of(url)), "a code in the log");
}

/// `POST /session` with the code of `url`, on the plaintext dashboard on
/// `port` (what the sign-in page does).
fn plain_exchange(port: u16, url: &str) -> Reply {
    let body = json!({ "code": code_of(url) }).to_string();
    let mut c = common::tool("curl");
    c.args([
        "-sS",
        "-i",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
    ])
    .args(["-H", "X-Ramd-Csrf: 1", "--data", &body])
    .arg(format!("http://127.0.0.1:{port}/session"));
    Reply::parse(&common::run(&mut c).ok().stdout)
}

/// A benchmark report in `ramd bench --json`'s shape, with a small plot
/// naming each target.
fn bench_report(targets: &[(&str, &str)]) -> String {
    let latency =
        json!({"mean": 20.5, "p50": 18.0, "p95": 30.0, "p99": 41.0, "p99_9": 90.0, "max": 400.0});
    let results: Vec<Value> = targets
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            json!({
                "target": name, "test": "randread-4k-qd1", "iops": 50000.0 / (i + 1) as f64,
                "mib_s": 195.3 / (i + 1) as f64, "ios": 100000, "bytes": 409600000u64,
                "elapsed_s": 2.0, "errors": 0, "lat_us": latency,
            })
        })
        .collect();
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"480\" height=\"120\" viewBox=\"0 0 480 120\"><rect x=\"10\" y=\"20\" width=\"300\" height=\"30\" fill=\"#1f6feb\"/><rect x=\"10\" y=\"70\" width=\"60\" height=\"30\" fill=\"#cf222e\"/><text x=\"320\" y=\"40\">{}</text><text x=\"80\" y=\"90\">{}</text></svg>",
        esc(targets[0].0),
        esc(targets[1].0)
    );
    let report = json!({
        "version": 1, "tool": "ramd test", "profile": "quick",
        "started_at": "2026-01-02T03:04:05Z", "finished_at": "2026-01-02T03:04:09Z",
        "runtime_s": 2.0,
        "host": {"hostname": "test", "cpus": 2, "kernel": "6.1"},
        "targets": targets.iter().map(|(name, kind)| json!({
            "name": name, "kind": kind, "path": format!("/somewhere/{name}"), "engine": "nbd",
            "direct_io": false, "page_cache": false, "working_set_bytes": 67108864u64,
        })).collect::<Vec<_>>(),
        "tests": [{"name": "randread-4k-qd1", "description": "4 KiB random reads, QD1", "rw": "randread",
                   "read_pct": 100, "block_bytes": 4096, "iodepth": 1, "jobs": 1}],
        "results": results,
    });
    json!({"report": report, "svg": svg}).to_string()
}

/// Where the screenshots go: target/test-output/dashboard/.
fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-output/dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn in_a_browser() {
    if !require(&["chromium", "chromedriver", "openssl", "curl"])
        || !require_python_module("selenium", "python3-selenium")
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let dash = Dash::start();
    let hostile = format!("/var/tmp/{MARKUP}.img");
    let targets = [("plain", "drive"), (hostile.as_str(), "file")];
    let (status, body) = common::http(
        dash.d.api_socket(),
        "PUT",
        "/v1/bench/latest",
        Some(&bench_report(&targets)),
    );
    assert_eq!(status, 200, "{body}");
    let out_dir = output_dir();
    for old in [
        "dashboard.png",
        "dashboard-read-only.png",
        "dashboard-failed.png",
    ] {
        let _ = std::fs::remove_file(out_dir.join(old));
    }
    let plan = json!({
        "read_only_url": dash.link(false),
        "admin_url": dash.link(true),
        "base_url": format!("{}/", dash.base()),
        "spki": dash.spki(),
        "drives": DRIVES,
        "caches": [CACHE],
        "io_drive": "plain",
        "io_uri": dash.d.uri("plain"),
        "persistent": "keep",
        "persistent_uri": dash.d.uri("keep"),
        "cache_uri": dash.d.uri(CACHE),
        "new_drive": "webdrive",
        "refused_drive": "rodrive",
        "delete_drive": "scrap",
        "snapshot_drive": "plain",
        "bench_targets": targets.iter().map(|t| t.0).collect::<Vec<_>>(),
        "markup": MARKUP,
        "cli": [
            env!("CARGO_BIN_EXE_ramd"),
            "--api-socket",
            dash.d.api_socket(),
        ],
        "short_link": [
            env!("CARGO_BIN_EXE_ramd"),
            "--api-socket",
            dash.d.api_socket(),
            "dashboard",
            "--expires",
            // Long enough for a busy machine to open it before it expires
            // (the page must see the session end while it is open).
            "15s",
        ],
        "out_dir": out_dir,
    });
    common::run(dash.d.cli().args(["create", "scrap", "--size", "4M"])).ok();
    // One remote (Garage), so the page's Snapshot button pushes to it.
    let _serial = common::garage::serial();
    let Some(garage) = common::garage::Garage::start() else {
        return;
    };
    let creds = common::garage::creds_file(dash.d.dir(), &garage, None);
    common::garage::add_remote(&dash.d, &garage, "g", &garage.bucket, &creds);
    let plan_file = dash.d.dir().join("plan.json");
    std::fs::write(&plan_file, plan.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dashboard.py");
    let mut c = common::tool("/usr/bin/python3");
    c.arg(&script).arg(&plan_file);
    let out = common::try_run(&mut c, Duration::from_secs(600)).expect("the browser script ran");
    assert!(out.status.success(), "{out}\ndaemon log:\n{}", dash.d.log());
    let seen: Value = serde_json::from_str(out.stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("browser saw: {seen}");
    assert_eq!(seen["cookie_secure"], true, "{seen}");
    assert_eq!(seen["read_only_buttons_disabled"], true, "{seen}");
    assert!(seen["iops_peak"].as_f64().unwrap() > 0.0, "{seen}");
    assert!(seen["hit_ratio_peak"].as_f64().unwrap() > 0.0, "{seen}");
    // The admin page, opened after that I/O, plots the ratio since the
    // cache was made at once (the table's 99.9%), then a line of
    // per-second ratios while the cache is read again.
    assert!(seen["hit_ratio_overall"].as_f64().unwrap() > 90.0, "{seen}");
    assert!(seen["hit_ratio_points"].as_u64().unwrap() >= 2, "{seen}");
    assert!(seen["dirty_peak_mib"].as_f64().unwrap() >= 4.0, "{seen}");
    assert_eq!(seen["console_errors"], json!([]), "{seen}");
    assert_eq!(seen["bench"], json!([hostile, "plain"]), "{seen}");
    assert_eq!(seen["markup_as_text"], 2, "{seen}");
    assert!(
        seen["expired_notice"]
            .as_str()
            .unwrap()
            .contains("session has expired"),
        "{seen}"
    );
    // Revoked while open: the stream ended and the page said so.
    assert!(
        seen["revoked_notice"]
            .as_str()
            .unwrap()
            .contains("session has ended"),
        "{seen}"
    );

    // The daemon's side: the admin's drive exists as the page made it,
    // the read-only attempt made nothing, the persistent drive synced.
    let list: Value = serde_json::from_str(
        &common::run(dash.d.cli().args(["list", "--json"]))
            .ok()
            .stdout,
    )
    .unwrap();
    let drives = list["drives"].as_array().unwrap();
    let web = drives
        .iter()
        .find(|d| d["name"] == "webdrive")
        .expect("webdrive was created");
    assert_eq!(web["size_bytes"], 16 << 20, "{web}");
    assert_eq!(web["compression"]["algorithm"], "lz4", "{web}");
    assert_eq!(web["origin"], "api");
    assert!(
        drives.iter().all(|d| d["name"] != "rodrive"),
        "the read-only create went through"
    );
    assert!(
        drives.iter().all(|d| d["name"] != "scrap"),
        "the page's delete did not delete"
    );
    // The page's snapshot push ran to the end.
    let started = seen["snapshot_notice"].as_str().unwrap().to_owned();
    let id: u64 = started
        .split("(job ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no job id in '{started}'"));
    let job = common::garage::wait_job(&dash.d, id);
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["drive"], "plain", "{job}");
    assert!(
        seen["delete_confirm"]
            .as_str()
            .unwrap()
            .contains("Delete drive 'scrap'")
            && seen["delete_notice"]
                .as_str()
                .unwrap()
                .contains("'scrap' deleted"),
        "{seen}"
    );
    let keep = drives.iter().find(|d| d["name"] == "keep").unwrap();
    assert!(
        keep["persist"]["status"]["syncs_ok"].as_u64().unwrap() >= 1,
        "{keep}"
    );
    for png in ["dashboard.png", "dashboard-read-only.png"] {
        let bytes = std::fs::read(out_dir.join(png)).unwrap();
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{png} is not a PNG"
        );
    }
}
