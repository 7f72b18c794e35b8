//! Every example in the documentation is one the daemon accepts: each
//! ```toml block of README.md and docs/*.md loads with the config parser
//! the daemon uses, each ```json block parses (drive.json as the daemon's
//! settings file), and each `curl ... -d '{...}'` body parses as the
//! request type of its route. A doc edit that breaks an example fails
//! here, not in a user's hands. Where a test can run an example it does:
//! the curl requests against a daemon, the `$(ramd info ...)` lookups,
//! the TLS recipe's openssl commands (and a client using the result), the
//! Garage recipe of docs/snapshots.md.

mod common;

use std::path::{Path, PathBuf};

use ramd::api::wire::attachments::CreateAttachment;
use ramd::api::wire::caches::CreateCache;
use ramd::api::wire::dirs::{AddDir, PatchDir};
use ramd::api::wire::drives::{CreateDrive, PatchDrive};
use ramd::api::wire::persistence::RestoreRequest;
use ramd::control::config;
use ramd::control::drives::persistent::settings::DriveSettings;

/// README.md and every docs/*.md, sorted.
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    files
}

/// The fenced blocks of `lang` in `text` (blocks of other languages are
/// skipped whole, so their lines are never taken for fences): (1-based
/// line of the opening fence, contents).
fn fenced(text: &str, lang: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut inside: Option<(bool, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match inside.as_mut() {
            Some(_) if t.starts_with("```") => {
                let (wanted, at, body) = inside.take().unwrap();
                if wanted {
                    out.push((at, body));
                }
            }
            Some((_, _, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None if t.starts_with("```") => {
                let wanted = t.trim_start_matches('`').trim() == lang;
                inside = Some((wanted, i + 1, String::new()));
            }
            None => {}
        }
    }
    out
}

#[test]
fn every_toml_example_loads_with_the_config_parser() {
    let mut seen = 0;
    let mut failures = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, body) in fenced(&text, "toml") {
            seen += 1;
            let name = PathBuf::from(format!("{}:{line}", file.display()));
            if let Err(e) = config::parse(&name, &body) {
                failures.push(format!("{e}\n{body}"));
            }
        }
    }
    assert!(seen >= 3, "found only {seen} toml examples");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_json_example_parses() {
    let mut seen = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, body) in fenced(&text, "json") {
            seen += 1;
            let at = format!("{}:{line}", file.display());
            let v: serde_json::Value =
                serde_json::from_str(&body).unwrap_or_else(|e| panic!("{at}: {e}\n{body}"));
            if file.ends_with("formats.md") && v.get("durability").is_some() {
                let s: DriveSettings = serde_json::from_value(v)
                    .unwrap_or_else(|e| panic!("{at}: not a drive.json: {e}\n{body}"));
                s.to_spec().unwrap_or_else(|e| panic!("{at}: {e}"));
            }
        }
    }
    assert!(seen >= 1, "found no json examples");
}

/// The `curl` command lines of a text, continuation lines joined.
fn curl_lines(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter(|l| l.contains("curl ") && l.contains("http://ramd/"))
        .map(str::to_owned)
        .collect()
}

/// Checks one request body against the type of its route.
fn check_body(method: &str, path: &str, body: &str) -> Result<(), String> {
    fn parse<T: serde::de::DeserializeOwned>(body: &str) -> Result<(), String> {
        serde_json::from_str::<T>(body)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("POST", ["v1", "drives"]) => parse::<CreateDrive>(body),
        ("PATCH", ["v1", "drives", _]) => parse::<PatchDrive>(body),
        ("POST", ["v1", "drives", _, "restore"]) => parse::<RestoreRequest>(body),
        ("POST", ["v1", "caches"]) => parse::<CreateCache>(body),
        ("POST", ["v1", "attachments"]) => parse::<CreateAttachment>(body),
        ("POST", ["v1", "dirs"]) => parse::<AddDir>(body),
        ("PATCH", ["v1", "dirs", _]) => parse::<PatchDir>(body),
        _ => Err(format!("no request type known for {method} {path}")),
    }
}

#[test]
fn every_curl_request_body_parses_as_its_route_type() {
    let mut seen = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in curl_lines(&text) {
            let Some((_, rest)) = line.split_once(" -d '") else {
                continue;
            };
            let body = rest.split('\'').next().unwrap();
            let method = line
                .split_once("-X ")
                .map_or("POST", |(_, m)| m.split_whitespace().next().unwrap());
            let url = line.split("http://ramd").nth(1).unwrap();
            let path = url
                .split(|c: char| c.is_whitespace() || c == '\'' || c == '?')
                .next()
                .unwrap();
            seen += 1;
            check_body(method, path, body)
                .unwrap_or_else(|e| panic!("{}: {line}: {e}", file.display()));
        }
    }
    assert!(seen >= 2, "found only {seen} curl bodies");
}

// ---------------------------------------------------------------------
// Examples that must paste and work (issue 27): the socket paths come
// from ramd, curl sends JSON with its Content-Type, `remote add` names
// a region, the TLS recipe's certificate names localhost, the Garage
// recipe runs, and the README's prerequisites cover the examples' tools.

/// How the docs find the daemon's API socket, NBD socket and a drive's
/// URI (each page that needs one defines it with exactly this line).
const FIND_API_SOCKET: &str = r#"sock=$(ramd info | awk '$1 == "api" {print $3}')"#;

/// Every shell line of the fenced `sh` blocks of `text`, continuation
/// lines joined: (1-based line of its block, the line).
fn sh_lines(text: &str) -> Vec<(usize, String)> {
    fenced(text, "sh")
        .into_iter()
        .flat_map(|(at, body)| {
            body.replace("\\\n", " ")
                .lines()
                .map(|l| (at, l.to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The `curl` commands of a page that talk to the unix socket.
fn socket_curls(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter(|l| l.contains("curl ") && l.contains("--unix-socket"))
        .map(|l| l.trim().to_owned())
        .collect()
}

/// A doc's name for messages.
fn name(file: &Path) -> String {
    file.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn every_curl_example_finds_the_socket_and_sends_json() {
    let mut seen = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let curls = socket_curls(&text);
        let Some(first) = curls.first() else { continue };
        let at = |s: &str| text.replace("\\\n", " ").find(s);
        let defined = at(FIND_API_SOCKET);
        assert!(
            defined.is_some_and(|d| d < at(first).unwrap()),
            "{}: its curl examples need `{FIND_API_SOCKET}` before the first",
            name(&file)
        );
        for c in &curls {
            seen += 1;
            assert!(
                c.contains(r#"--unix-socket "$sock""#) && c.contains("http://ramd/"),
                "{}: `{c}`: use --unix-socket \"$sock\" and http://ramd/",
                name(&file)
            );
            if c.contains(" -d ") {
                assert!(
                    c.contains("-H 'Content-Type: application/json'"),
                    "{}: `{c}` sends JSON without -H 'Content-Type: application/json' (the API answers 415)",
                    name(&file)
                );
            }
        }
    }
    assert!(seen >= 10, "found only {seen} curl examples");
}

/// The curl examples run against a daemon, page by page, as pasted: the
/// socket found by the page's own line, each request answered 2xx. Left
/// out: endless event streams (`-N`) and directories in RAM (they name
/// a user's home directory).
#[test]
fn curl_examples_run_against_a_daemon() {
    if !common::require(&["curl"]) {
        return;
    }
    let mut ran = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let curls: Vec<String> = socket_curls(&text)
            .into_iter()
            .filter(|c| !c.contains(" -N ") && !c.contains("/v1/dirs"))
            .collect();
        if curls.is_empty() {
            continue;
        }
        let d = common::Daemon::launch(
            &["daemon", "--drive", "a=64M", "--mem-budget", "64G"].map(String::from),
            &[],
        );
        let script = format!(
            "set -e\ncurl() {{ command curl --fail-with-body \"$@\"; echo; }}\n{FIND_API_SOCKET}\ntest -S \"$sock\"\n{}\n",
            curls.join("\n")
        );
        let out = common::run(
            common::tool("bash")
                .env("PATH", path_with_ramd())
                .env("RAMD_API_SOCKET", d.api_socket())
                .args(["-c", &script]),
        );
        assert!(
            out.status.success(),
            "{}: the curl examples failed:\n{script}\n{out}",
            name(&file)
        );
        ran += curls.len();
    }
    assert!(ran >= 8, "ran only {ran} curl examples");
}

/// PATH with the ramd under test first, so `ramd info` in an example
/// runs it.
fn path_with_ramd() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_ramd")).parent().unwrap();
    let mut dirs = vec![bin.to_path_buf()];
    dirs.extend(std::env::split_paths(&common::child_path()));
    std::env::join_paths(dirs).unwrap()
}

/// Every `$(ramd info ... | awk ...)` of the docs (and of `ramd --help`)
/// prints the path or URI it stands for, with a daemon whose runtime
/// directory is not /run/ramd.
#[test]
fn ramd_info_lookups_in_the_docs_print_what_they_name() {
    let lookup = regex_lite_find_all;
    let mut found = std::collections::BTreeSet::new();
    for file in doc_files() {
        found.extend(lookup(&std::fs::read_to_string(&file).unwrap()));
    }
    let help = common::run(common::ramd().arg("--help")).ok().stdout;
    found.extend(lookup(&help));
    assert!(found.len() >= 3, "found only {found:?}");
    let d = common::Daemon::start(&["db=16M"]);
    for cmd in &found {
        let out = common::run(
            common::tool("bash")
                .env("PATH", path_with_ramd())
                .env("RAMD_API_SOCKET", d.api_socket())
                .args(["-c", cmd]),
        )
        .ok();
        let want = if cmd.contains("ramd info db") {
            d.uri("db")
        } else if cmd.contains(r#""api""#) {
            d.api_socket().display().to_string()
        } else if cmd.contains(r#""nbd""#) {
            d.socket().display().to_string()
        } else {
            panic!("a lookup this test does not know: {cmd}")
        };
        assert_eq!(out.stdout.trim(), want, "{cmd}");
    }
}

/// The commands inside `$( ... )` that start with `ramd info`.
fn regex_lite_find_all(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("$(ramd info") {
        let cmd = &rest[i + 2..];
        let end = cmd.find(')').expect("a closing parenthesis");
        out.push(cmd[..end].to_owned());
        rest = &cmd[end..];
    }
    out
}

/// Every `ramd remote add` with an endpoint (and every `[[remote]]` with
/// one) names the region: without it requests are signed for us-east-1,
/// which Garage and most non-AWS servers refuse.
#[test]
fn remote_examples_carry_a_region() {
    let mut seen = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, l) in sh_lines(&text) {
            if l.contains("ramd remote add") && l.contains("--endpoint") {
                seen += 1;
                assert!(l.contains("--region"), "{}:{at}: {l}", name(&file));
            }
        }
        for (at, body) in fenced(&text, "toml") {
            for table in body.split("[[").filter(|t| t.starts_with("remote]]")) {
                if table.contains("endpoint") {
                    seen += 1;
                    assert!(table.contains("region"), "{}:{at}: {table}", name(&file));
                }
            }
        }
    }
    assert!(seen >= 4, "found only {seen} remote examples");
}

/// docs/tls.md's openssl recipe, run as pasted, makes a server
/// certificate that names localhost and 127.0.0.1, which a daemon serves
/// and nbdinfo accepts at nbds://localhost:PORT (the client certificate
/// from the same recipe); the client examples keep tls-certificates=
/// away from nbdsh and fio, which Debian 12's libnbd refuses it from.
#[test]
fn the_tls_recipe_makes_certificates_clients_accept_for_localhost() {
    if !common::require(&["openssl", "nbdinfo"]) {
        return;
    }
    let text = std::fs::read_to_string(doc("tls.md")).unwrap();
    for (at, l) in sh_lines(&text) {
        if l.starts_with("nbdsh") || l.starts_with("fio") {
            assert!(!l.contains("tls-certificates="), "tls.md:{at}: {l}");
        }
    }
    assert!(
        text.contains("/etc/pki/libnbd"),
        "tls.md: libnbd's directory for root"
    );
    let recipe = fenced(&text, "sh")
        .into_iter()
        .map(|(_, b)| b)
        .find(|b| b.contains("openssl req -x509"))
        .expect("an openssl recipe in tls.md");
    let dir = tempfile::tempdir().unwrap();
    common::run(
        common::tool("bash")
            .current_dir(dir.path())
            .args(["-c", &format!("set -e\n{recipe}")]),
    )
    .ok();
    let san = common::run(common::tool("openssl").current_dir(dir.path()).args([
        "x509",
        "-in",
        "server-cert.pem",
        "-noout",
        "-ext",
        "subjectAltName",
    ]))
    .ok()
    .stdout;
    for want in [
        "DNS:localhost",
        "IP Address:127.0.0.1",
        "DNS:nbd.example.org",
    ] {
        assert!(san.contains(want), "{want} not in {san}");
    }
    let certs = dir.path().to_str().unwrap();
    let d = common::Daemon::launch(
        &[
            "daemon",
            "--drive",
            "ram0=64M",
            "--tls-certificates",
            certs,
            "--nbd-listen",
            "localhost:0",
        ]
        .map(String::from),
        &[],
    );
    let v: serde_json::Value =
        serde_json::from_str(&common::run(d.cli().args(["list", "--json"])).ok().stdout).unwrap();
    let tcp = v["drives"][0]["tcp_uris"][0].as_str().unwrap().to_owned();
    assert!(tcp.starts_with("nbds://127.0.0.1:"), "{v}");
    let table = common::run(d.cli().arg("list")).ok().stdout;
    assert!(table.contains(&tcp), "ramd list hides {tcp}:\n{table}");
    let uri = format!(
        "{}?tls-certificates={certs}",
        tcp.replace("127.0.0.1", "localhost")
    );
    let out = common::run(common::tool("nbdinfo").arg("--size").arg(&uri)).ok();
    assert_eq!(out.stdout.trim(), (64u64 << 20).to_string(), "{out}");
    let host = tcp["nbds://".len()..].split('/').next().unwrap();
    run_tls_clients_as_pasted(&text, dir.path(), &host.replace("127.0.0.1", "localhost"));
}

/// The client lines of docs/tls.md that need no file of their own
/// (libnbd's directory filled, nbdinfo, nbdsh and fio over nbds://) run
/// from the recipe's directory with `nbd.example.org` replaced by
/// `host`, as a user other than root (so libnbd's directory is
/// $HOME/.pki/libnbd, not the machine's /etc/pki/libnbd).
fn run_tls_clients_as_pasted(text: &str, certs: &Path, host: &str) {
    use std::os::unix::fs::PermissionsExt;
    if !common::require(&["nbdsh", "fio"]) {
        return;
    }
    let block = fenced(text, "sh")
        .into_iter()
        .map(|(_, b)| b)
        .find(|b| b.contains("pki=$("))
        .expect("the client block of tls.md");
    let wanted = [
        "pki=",
        "mkdir -p \"$pki\"",
        "nbdinfo nbds://",
        "nbdsh -u nbds://",
        "fio ",
    ];
    let lines: Vec<String> = block
        .lines()
        .filter(|l| wanted.iter().any(|w| l.starts_with(w)))
        .map(|l| l.replace("nbd.example.org", host))
        .collect();
    assert_eq!(lines.len(), wanted.len(), "tls.md's client block: {block}");
    let home = tempfile::tempdir().unwrap();
    let nobody = 65534;
    std::os::unix::fs::chown(home.path(), Some(nobody), Some(nobody)).unwrap();
    let open = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    open(certs, 0o755).unwrap();
    for f in std::fs::read_dir(certs).unwrap() {
        open(&f.unwrap().path(), 0o644).unwrap();
    }
    let script = format!("set -e\n{}\n", lines.join("\n"));
    let out = common::run(
        common::tool("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["bash", "-c", &script])
            .env("HOME", home.path())
            .current_dir(certs),
    );
    assert!(out.status.success(), "{script}\n{out}");
    assert!(
        home.path().join(".pki/libnbd/client-key.pem").is_file(),
        "the client files went elsewhere"
    );
    assert!(
        out.stdout.contains(&(64u64 << 20).to_string()),
        "nbdsh: {out}"
    );
}

/// docs/snapshots.md's Garage recipe runs as pasted (a fresh HOME, the
/// daemon's drive ram0): Garage set up on loopback, the remote added
/// with its region, a labelled snapshot pushed and listed.
#[test]
fn the_garage_recipe_runs() {
    let Some(garage) = common::garage::find_garage() else {
        let skip = std::env::var("RAMD_SKIP_MISSING_TOOLS").as_deref() == Ok("1");
        assert!(
            skip,
            "missing tool garage: scripts/test-deps.sh installs it"
        );
        return;
    };
    if !common::require(&["openssl"]) {
        return;
    }
    let _serial = common::garage::serial();
    let text = std::fs::read_to_string(doc("snapshots.md")).unwrap();
    let recipe = fenced(&text, "sh")
        .into_iter()
        .map(|(_, b)| b)
        .find(|b| b.contains("garage -c garage.toml server"))
        .expect("a Garage recipe in snapshots.md");
    let home = tempfile::tempdir().unwrap();
    let d = common::Daemon::start(&["ram0=16M"]);
    let mut path = vec![garage.parent().unwrap().to_path_buf()];
    path.extend(std::env::split_paths(&path_with_ramd()));
    // The server the recipe starts in the background stops with the shell.
    let script = format!("set -e\ntrap 'kill $! 2>/dev/null' EXIT\n{recipe}");
    let out = common::try_run(
        common::tool("bash")
            .env("HOME", home.path())
            .env("PATH", std::env::join_paths(path).unwrap())
            .env("RAMD_API_SOCKET", d.api_socket())
            .args(["-c", &script]),
        std::time::Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "the Garage recipe failed:\n{out}");
    assert!(
        out.stdout.contains("first try") && out.stdout.contains("ram0/"),
        "no labelled snapshot listed:\n{out}"
    );
}

/// A page of docs/.
fn doc(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(file)
}

/// README's prerequisites name the Debian package of every client tool
/// its examples run.
#[test]
fn readme_prerequisites_name_the_package_of_every_tool_used() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let install = sh_lines(&readme)
        .into_iter()
        .map(|(_, l)| l)
        .find(|l| l.starts_with("apt-get install"))
        .expect("README lists its prerequisites with apt-get install");
    let packages: Vec<&str> = install
        .split('#')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    for (tool, package) in [
        ("qemu-img", "qemu-utils"),
        ("nbdinfo", "libnbd-bin"),
        ("nbdcopy", "libnbd-bin"),
        ("fio", "fio"),
        ("mkfs.ext4", "e2fsprogs"),
        ("curl", "curl"),
    ] {
        let used = sh_lines(&readme)
            .iter()
            .any(|(_, l)| l.split_whitespace().any(|w| w == tool) && !l.starts_with("apt-get"));
        if used || tool == "qemu-img" {
            assert!(
                packages.contains(&package),
                "README runs {tool} but its prerequisites lack {package}: {install}"
            );
        }
    }
}
