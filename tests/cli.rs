//! The command line against a running daemon: each command's table and
//! JSON output, exit codes 0/1/2, the "daemon not running" message,
//! completions and the man page.

mod common;

use common::*;
use serde_json::Value;

fn cli_ok(d: &Daemon, args: &[&str]) -> String {
    let out = run(d.cli().args(args)).ok();
    assert_eq!(out.code(), 0, "{out}");
    out.stdout
}

fn cli_json(d: &Daemon, args: &[&str]) -> Value {
    let text = cli_ok(d, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("ramd {args:?}: not JSON ({e}): {text}"))
}

#[track_caller]
fn cli_fails(d: &Daemon, args: &[&str], code: i32, want: &str) -> String {
    let out = run(d.cli().args(args));
    assert_eq!(out.code(), code, "{out}");
    assert!(out.stderr.contains(want), "want {want:?} in: {out}");
    out.stderr
}

/// The header and rows of a table, split on runs of spaces.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

#[test]
fn daemon_not_running_says_so_and_how_to_start_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    for args in [
        &["list"][..],
        &["info", "x"],
        &["create", "a", "--size", "1M"],
        &["stats"],
    ] {
        let out = run(ramd().env("RAMD_API_SOCKET", &sock).args(args)).failed();
        assert_eq!(out.code(), 1, "{out}");
        assert!(out.stderr.contains("daemon is not running"), "{out}");
        assert!(out.stderr.contains("ramd daemon"), "{out}");
        assert!(out.stderr.contains(&sock.display().to_string()), "{out}");
    }
}

#[test]
fn usage_errors_exit_2_help_exits_0() {
    for args in [
        &["bogus"][..],
        &["create"],
        &["create", "x"],
        &["resize", "x"],
        &["stats", "--count", "2"],
    ] {
        let out = run(ramd().args(args)).failed();
        assert_eq!(out.code(), 2, "{out}");
    }
    let out = run(ramd().arg("--help")).ok();
    for word in [
        "daemon",
        "create",
        "list",
        "stats",
        "attach",
        "detach",
        "completions",
        "man",
    ] {
        assert!(out.stdout.contains(word), "--help lacks {word}: {out}");
    }
    let out = run(ramd().args(["create", "--help"])).ok();
    assert!(out.stdout.contains("--mem-limit"), "{out}");
    run(ramd().arg("--version")).ok();
}

#[test]
fn every_command_prints_a_table_and_json() {
    let d = Daemon::launch(&["daemon".into(), "--drive".into(), "ram0=64M".into()], &[]);

    // create
    let out = cli_ok(&d, &["create", "db", "--size", "16M", "--mem-limit", "8M"]);
    assert!(
        out.contains("created db (16 MiB) at nbd+unix:///db?socket="),
        "{out}"
    );
    let v = cli_json(
        &d,
        &["create", "ro", "--size", "1M", "--read-only", "--json"],
    );
    assert_eq!(
        (v["name"].as_str(), v["read_only"].as_bool()),
        (Some("ro"), Some(true))
    );
    cli_fails(&d, &["create", "db", "--size", "1M"], 1, "already exists");
    cli_fails(
        &d,
        &["create", "x", "--size", "12Q"],
        2,
        "unknown size unit",
    );
    cli_fails(
        &d,
        &["create", "Bad", "--size", "1M"],
        2,
        "invalid drive name",
    );

    // list
    let table = cli_ok(&d, &["list"]);
    let r = rows(&table);
    assert_eq!(
        r[0],
        ["NAME", "SIZE", "USED", "LIMIT", "MODE", "CONNS", "ATTACHED", "COMPRESS", "URI"],
        "{table}"
    );
    assert_eq!(r.len(), 4, "{table}");
    assert_eq!(
        &r[1][..6],
        ["db", "16 MiB", "0 B", "8 MiB", "rw", "0"],
        "{table}"
    );
    assert_eq!(&r[2][..5], ["ram0", "64 MiB", "0 B", "-", "rw"], "{table}");
    assert_eq!(&r[3][..5], ["ro", "1 MiB", "0 B", "-", "ro"], "{table}");
    let v = cli_json(&d, &["list", "--json"]);
    let names: Vec<&str> = v["drives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["db", "ram0", "ro"]);

    // info
    let table = cli_ok(&d, &["info", "db"]);
    assert!(table.contains("16 MiB (16777216 bytes)"), "{table}");
    assert!(table.contains("limit 8 MiB"), "{table}");
    let v = cli_json(&d, &["info", "db", "--json"]);
    assert_eq!(v["size_bytes"], 16u64 << 20);
    cli_fails(&d, &["info", "nope"], 1, "no drive named 'nope'");
    let table = cli_ok(&d, &["info"]);
    assert!(
        table.contains("memory budget") && table.contains("api socket"),
        "{table}"
    );
    let v = cli_json(&d, &["info", "--json"]);
    assert_eq!(v["status"], "ok");
    assert_eq!(v["drives"], 3);

    // stats
    let table = cli_ok(&d, &["stats"]);
    let r = rows(&table);
    assert_eq!(
        r[0][..4],
        ["NAME", "IOPS R/W", "MiB/s R/W", "READ p50/p99/p99.9"],
        "{table}"
    );
    assert!(table.contains("budget:"), "{table}");
    let v = cli_json(&d, &["stats", "--json"]);
    assert_eq!(v["drives"].as_array().unwrap().len(), 3);
    let v = cli_json(&d, &["stats", "db", "--json"]);
    assert_eq!(v["drives"].as_array().unwrap().len(), 1);
    cli_fails(&d, &["stats", "nope"], 1, "no drive named");
    let text = cli_ok(&d, &["stats", "--watch", "--count", "2", "--json"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        let v: Value = serde_json::from_str(l).expect("one JSON document per line");
        assert!(v["drives"].is_array());
    }
    let text = cli_ok(&d, &["stats", "--watch", "--count", "2"]);
    assert_eq!(text.matches("IOPS R/W").count(), 2, "{text}");

    // resize, lock, unlock
    let out = cli_ok(&d, &["resize", "db", "32M"]);
    assert!(out.contains("db is now 32 MiB"), "{out}");
    let v = cli_json(&d, &["resize", "db", "24M", "--json"]);
    assert_eq!(v["size_bytes"], 24u64 << 20);
    cli_fails(&d, &["resize", "db", "0"], 2, "at least 4 KiB (one page)");
    let out = cli_ok(&d, &["lock", "db"]);
    assert!(out.contains("db is read-only"), "{out}");
    let v = cli_json(&d, &["unlock", "db", "--json"]);
    assert_eq!(v["read_only"], false);
    // A drive from the daemon's command line: the change is ephemeral.
    let out = run(d.cli().args(["lock", "ram0"])).ok();
    assert!(
        out.stderr.contains("lasts until the daemon restarts"),
        "{out}"
    );

    // attachments (listing only; tests/attach.rs mounts)
    assert!(cli_ok(&d, &["attach", "--list"]).contains("no attachments"));
    let v = cli_json(&d, &["attach", "--list", "--json"]);
    assert_eq!(v["attachments"], serde_json::json!([]));
    cli_fails(
        &d,
        &["detach", d.dir().to_str().unwrap()],
        1,
        "nothing is attached",
    );

    // delete
    let out = cli_ok(&d, &["delete", "db"]);
    assert!(out.contains("deleted db"), "{out}");
    let v = cli_json(&d, &["delete", "ro", "--json"]);
    assert_eq!(v["name"], "ro");
    cli_fails(&d, &["delete", "db"], 1, "no drive named 'db'");
    let r = rows(&cli_ok(&d, &["list"]));
    assert_eq!(r.len(), 2);
}

#[test]
fn completions_and_man_page_generate() {
    let out = run(ramd().args(["completions", "bash"])).ok();
    assert!(
        out.stdout.contains("_ramd()") && out.stdout.contains("attach"),
        "{out}"
    );
    let out = run(ramd().args(["completions", "zsh"])).ok();
    assert!(out.stdout.contains("#compdef ramd"), "{out}");
    let out = run(ramd().args(["completions", "fish"])).ok();
    assert!(out.stdout.contains("complete -c ramd"), "{out}");
    run(ramd().args(["completions", "tcsh"])).failed();
    let out = run(ramd().arg("man")).ok();
    assert!(
        out.stdout.starts_with(".ie") || out.stdout.contains(".TH ramd"),
        "{out}"
    );
    assert!(out.stdout.contains("create"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    run(ramd().args(["man", "--dir"]).arg(dir.path())).ok();
    for page in ["ramd.1", "ramd-create.1", "ramd-daemon.1", "ramd-attach.1"] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}: {text}");
    }
}

/// Issue 15 item 12: a size or a name the command line can check is a
/// usage error (exit 2, clap's message), before any request: even with no
/// daemon running, which would be exit 1.
#[test]
fn bad_sizes_and_names_are_usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    for (args, want) in [
        (&["create", "Bad", "--size", "1M"][..], "invalid drive name"),
        (&["create", "x", "--size", "12Q"], "unknown size unit"),
        (&["create", "x", "--size", "0"], "at least 4 KiB (one page)"),
        (
            &["create", "x", "--size", "1M", "--mem-limit", "0"],
            "memory limit of 0",
        ),
        (&["resize", "x", "0"], "at least 4 KiB (one page)"),
        (&["resize", "x", "1Q"], "unknown size unit"),
        (&["delete", "-x"], ""),
        (&["info", "Bad"], "invalid drive name"),
        (&["lock", "a b"], "invalid drive name"),
        (
            &[
                "cache",
                "create",
                "DB",
                "--backing",
                "/x",
                "--size",
                "1M",
                "--mode",
                "writeback",
            ],
            "invalid cache name",
        ),
        (
            &[
                "cache",
                "create",
                "db",
                "--backing",
                "/x",
                "--size",
                "1Q",
                "--mode",
                "writeback",
            ],
            "unknown size unit",
        ),
        (&["daemon", "--mem-budget", "0"], "memory budget of 0"),
        (&["daemon", "--max-connections", "0"], "max_connections = 0"),
        (&["daemon", "--log", "infp"], "unknown log level 'infp'"),
    ] {
        let out = run(ramd().env("RAMD_API_SOCKET", &sock).args(args)).failed();
        assert_eq!(out.code(), 2, "{out}");
        assert!(out.stderr.contains(want), "want {want:?} in: {out}");
        assert!(!out.stderr.contains("not running"), "{out}");
    }
    // Sizes may have a space before the unit, as ramd prints them.
    let out = run(ramd()
        .env("RAMD_API_SOCKET", &sock)
        .args(["create", "x", "--size", "1 GiB"]))
    .failed();
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("not running"), "{out}");
}

/// Issue 15 item 12: `ramd man DIR`, as the help suggests, writes the
/// pages like `--dir DIR`.
#[test]
fn man_takes_the_directory_as_an_argument() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(ramd().arg("man").arg(dir.path())).ok();
    assert!(out.stdout.contains("wrote man pages"), "{out}");
    assert!(dir.path().join("ramd-create.1").exists());
    run(ramd().args(["man", "a", "--dir", "b"])).failed();
    let help = run(ramd().args(["man", "--help"])).ok().stdout;
    assert!(help.contains("[DIR]"), "{help}");
}

/// `ramd ARGS` with stdout on a pipe whose reader is gone: (exit status,
/// stderr).
fn run_into_closed_pipe(cmd: &mut std::process::Command) -> (std::process::ExitStatus, String) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors we own from here on.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both are fresh descriptors nobody else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, TOOL_TIMEOUT).expect("ramd exits");
    (status, std::fs::read_to_string(err.path()).unwrap())
}

/// Issue 15 item 12: `ramd completions bash | head -1`, `ramd list |
/// head`: a reader that goes away ends the command quietly (no panic).
#[test]
fn a_closed_stdout_ends_quietly_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let d = Daemon::start(&["ram0=1M"]);
    for args in [
        &["completions", "bash"][..],
        &["list"],
        &["stats"],
        &["info", "ram0", "--json"],
        &["man"],
    ] {
        let (status, stderr) = run_into_closed_pipe(d.cli().args(args));
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            status.success() || status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {status}: {stderr}"
        );
    }
}

/// Issue 15 item 12: the persistence table of `ramd stats` has a heading
/// for every column.
#[test]
fn stats_persistence_table_has_a_heading_per_column() {
    let d = Daemon::start(&["db=1M,persist"]);
    wait_until("db to be ready", DAEMON_TIMEOUT, || {
        cli_json(&d, &["info", "db", "--json"])["state"] == "ready"
    });
    let text = cli_ok(&d, &["stats"]);
    let table: Vec<&str> = text
        .split("persistence:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no persistence table: {text}"))
        .lines()
        .take(2)
        .collect();
    let r = rows(&table.join("\n"));
    assert_eq!(r[0].len(), r[1].len(), "{text}");
    assert!(r[0].contains(&"RESTORE".to_owned()), "{text}");
}

/// Writes a config file into `dir`.
fn config(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let p = dir.join("ramd.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Starts `ramd daemon --config CFG` in `dir` (expecting a refusal):
/// the output, and what is left in the runtime directory.
fn refused_start(
    dir: &std::path::Path,
    cfg: &std::path::Path,
    extra: &[&str],
) -> (Output, Vec<String>) {
    let runtime = dir.join("run");
    let out = run(ramd()
        .args(["daemon", "--config"])
        .arg(cfg)
        .arg("--runtime-dir")
        .arg(&runtime)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra))
    .failed();
    let left = std::fs::read_dir(&runtime)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    (out, left)
}

/// Issue 15 item 10: values that would leave the daemon useless stop it
/// with file:line:column, and so does a drive that does not fit the
/// budget.
#[test]
fn daemon_refuses_useless_config_values_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, want) in [
        (
            "[daemon]\nmem_budget = \"0\"\n",
            ":2:14: a memory budget of 0 bytes",
        ),
        (
            "[daemon]\nmem_budget = 0\n",
            ":2:14: a memory budget of 0 bytes",
        ),
        (
            "[daemon]\nmax_connections = 0\n",
            ":2:19: max_connections = 0",
        ),
        (
            "[daemon]\nlog = \"infp\"\n",
            ":2:7: unknown log level 'infp'",
        ),
        ("[daemon]\nlog = \"info,nbd\"\n", ":2:7: unknown log level"),
        ("[daemon]\nlog = \"\"\n", ":2:7: unknown log level"),
        (
            "[[drive]]\nname = \"a\"\nsize = \"1M\"\nmem_limit = \"0\"\n",
            ":4:13: a memory limit of 0 bytes",
        ),
        (
            "[daemon]\nmem_budget = \"1M\"\n\n[[drive]]\nname = \"big\"\nsize = \"1G\"\n",
            ":5:8: cannot create drive 'big'",
        ),
    ] {
        let cfg = config(dir.path(), text);
        let (out, left) = refused_start(dir.path(), &cfg, &[]);
        assert_eq!(out.code(), 1, "{out}");
        let want = format!("{}{want}", cfg.display());
        assert!(out.stderr.contains(&want), "want {want:?} in: {out}");
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    // A cache over the budget: the line of its declaration too.
    let backing = dir.path().join("backing.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let cfg = config(
        dir.path(),
        &format!(
            "[daemon]\nmem_budget = \"1M\"\n\n[[cache]]\nname = \"c\"\nbacking = \"{}\"\nsize = \"64M\"\nmode = \"writeback\"\n",
            backing.display()
        ),
    );
    let (out, left) = refused_start(dir.path(), &cfg, &[]);
    let want = format!("{}:5:8: cannot create cache 'c'", cfg.display());
    assert!(out.stderr.contains(&want), "want {want:?} in: {out}");
    assert!(left.is_empty(), "left behind: {left:?}");
    // Directives with levels, and plain levels, are fine.
    let cfg = config(
        dir.path(),
        "[daemon]\nlog = \"warn,ramd::nbd=debug\"\nmax_connections = 1\n[[drive]]\nname = \"a\"\nsize = \"1M\"\n",
    );
    let d = Daemon::launch(
        &[
            "daemon".into(),
            "--config".into(),
            cfg.display().to_string(),
        ],
        &[],
    );
    cli_ok(&d, &["info", "a"]);
}

/// Issue 15 item 10: a start refused after the sockets were bound (a
/// directory that cannot be kept in RAM, a TCP port in use) removes them.
#[test]
fn a_refused_start_leaves_no_socket_behind() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let cfg = config(
        dir.path(),
        &format!("[[dir]]\npath = \"{}\"\n", missing.display()),
    );
    let (out, left) = refused_start(dir.path(), &cfg, &[]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("ramd.toml:2:8:"), "{out}");
    assert!(left.is_empty(), "left behind: {left:?}: {out}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    let cfg = config(dir.path(), "");
    let (out, left) = refused_start(dir.path(), &cfg, &["--nbd-listen", &port]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(left.is_empty(), "left behind: {left:?}: {out}");
}

/// Issue 15 item 11: `ramd delete db --keep-data` then `ramd create db
/// --persist` keeps the stored durability and interval, and says so.
#[test]
fn recreated_persistent_drive_keeps_its_stored_settings() {
    let d = Daemon::start(&[]);
    cli_ok(
        &d,
        &[
            "create",
            "db",
            "--size",
            "1M",
            "--persist",
            "--durability",
            "flush",
            "--sync-interval",
            "10s",
        ],
    );
    cli_ok(&d, &["delete", "db", "--keep-data"]);
    let out = run(d.cli().args(["create", "db", "--persist"])).ok();
    assert!(
        out.stderr.contains("durability flush") && out.stderr.contains("sync interval 10s"),
        "says which settings it kept: {out}"
    );
    let v = cli_json(&d, &["info", "db", "--json"]);
    assert_eq!(v["persist"]["durability"], "flush", "{v}");
    assert_eq!(v["persist"]["sync_interval_ms"], 10_000, "{v}");
    let stored = std::fs::read_to_string(d.state_dir().join("drives/db/drive.json")).unwrap();
    assert!(stored.contains("\"flush\""), "{stored}");
    // Given explicitly, a setting changes (and the other is kept).
    cli_ok(&d, &["delete", "db", "--keep-data"]);
    let v = cli_json(
        &d,
        &[
            "create",
            "db",
            "--persist",
            "--durability",
            "periodic",
            "--json",
        ],
    );
    assert_eq!(v["persist"]["durability"], "periodic", "{v}");
    assert_eq!(v["persist"]["sync_interval_ms"], 10_000, "{v}");
    let notice = v["notice"].as_str().unwrap_or_default();
    assert!(notice.contains("sync interval 10s"), "{v}");
}

/// Issue 15 item 11: a damaged drive.json fails the drive, whoever
/// declares it, and is left as it is; `ramd restore` refuses until it is
/// fixed (or --force).
#[test]
fn damaged_drive_json_fails_the_drive_and_is_not_rewritten() {
    let mut d = Daemon::start(&["db=1M,persist,durability=flush"]);
    wait_until("db to be ready", DAEMON_TIMEOUT, || {
        cli_json(&d, &["info", "db", "--json"])["state"] == "ready"
    });
    d.terminate();
    let file = d.state_dir().join("drives/db/drive.json");
    std::fs::write(&file, "{\"version\": 1,").unwrap();
    d.restart();
    let v = cli_json(&d, &["info", "db", "--json"]);
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("drive.json is unusable"),
        "{v}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"version\": 1,");
    let out = run(d.cli().args(["restore", "db"])).failed();
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("drive.json is unusable"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"version\": 1,");

    // Re-created through the CLI: the same.
    cli_ok(&d, &["delete", "db", "--keep-data"]);
    let out = run(d.cli().args(["create", "db", "--persist"])).failed();
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("drive.json is unusable"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"version\": 1,");

    // --force goes ahead and writes the drive's current settings (those
    // of the re-create: nothing could be kept from the damaged file).
    run(d.cli().args(["restore", "db", "--force"])).ok();
    let v = cli_json(&d, &["info", "db", "--json"]);
    assert_eq!(v["state"], "ready", "{v}");
    let want = v["persist"]["durability"].clone();
    wait_until("drive.json to be written again", DAEMON_TIMEOUT, || {
        let text = std::fs::read_to_string(&file).unwrap();
        serde_json::from_str::<Value>(&text).is_ok_and(|s| s["durability"] == want)
    });
}

/// Issue 15 item 11: a drive created through the API whose drive.json is
/// damaged fails at start; once the file is fixed, `ramd restore` brings
/// it back with the settings the file holds.
#[test]
fn restore_uses_a_fixed_drive_json() {
    let mut d = Daemon::start(&[]);
    cli_ok(
        &d,
        &[
            "create",
            "db",
            "--size",
            "1M",
            "--persist",
            "--durability",
            "flush",
        ],
    );
    d.terminate();
    let file = d.state_dir().join("drives/db/drive.json");
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, "[]").unwrap();
    d.restart();
    let v = cli_json(&d, &["info", "db", "--json"]);
    assert_eq!(v["state"], "failed", "{v}");
    let out = run(d.cli().args(["restore", "db"])).failed();
    assert!(out.stderr.contains("drive.json is unusable"), "{out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "[]");
    std::fs::write(&file, &good).unwrap();
    run(d.cli().args(["restore", "db"])).ok();
    let v = cli_json(&d, &["info", "db", "--json"]);
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["persist"]["durability"], "flush", "{v}");
}

/// `ramd --help` takes the NBD URI from `ramd info` instead of naming a
/// socket path, which is wrong wherever the runtime directory is not
/// /run/ramd (XDG_RUNTIME_DIR set, or not root).
#[test]
fn help_takes_the_uri_from_ramd_info() {
    let out = run(ramd().arg("--help")).ok();
    assert!(!out.stdout.contains("/run/ramd/nbd.sock"), "{out}");
    assert!(out.stdout.contains("ramd info db"), "{out}");
}

/// `ramd list` shows what a drive is stored as (COMPRESS) and every URI
/// it is served at (one line per TCP listener), as `--json` does; listen
/// addresses take host names (`localhost:PORT` binds loopback, so
/// plaintext is allowed), and names that do not resolve or lack a port
/// are usage errors.
#[test]
fn list_shows_compression_and_every_uri_and_listeners_take_host_names() {
    let d = Daemon::launch(
        &[
            "daemon",
            "--drive",
            "z=64M,compress=lz4",
            "--drive",
            "r=16M",
            "--nbd-listen",
            "localhost:0",
            "--http",
            "localhost:0",
            "--tls",
            "off",
        ]
        .map(String::from),
        &[],
    );
    let v = cli_json(&d, &["list", "--json"]);
    let z = &v["drives"][1];
    assert_eq!(z["name"], "z", "{v}");
    assert_eq!(z["compression"]["algorithm"], "lz4", "{v}");
    let tcp = z["tcp_uris"][0].as_str().unwrap_or_default().to_owned();
    assert!(
        tcp.starts_with("nbd://127.0.0.1:") && tcp.ends_with("/z"),
        "{v}"
    );
    let table = cli_ok(&d, &["list"]);
    let r = rows(&table);
    assert_eq!(r[0][7], "COMPRESS", "{table}");
    // r, its TCP URI, z, its TCP URI.
    assert_eq!(r.len(), 5, "{table}");
    assert_eq!((r[1][0].as_str(), r[1][7].as_str()), ("r", "-"), "{table}");
    assert_eq!(
        (r[3][0].as_str(), r[3][7].as_str()),
        ("z", "lz4"),
        "{table}"
    );
    assert_eq!(r[4], [tcp.as_str()], "{table}");
    run(tool("nbdinfo").arg(&tcp)).ok();
    let info = cli_ok(&d, &["info"]);
    assert!(
        rows(&info)
            .iter()
            .any(|r| r[0] == "nbd tcp" && r[1].starts_with("127.0.0.1:")),
        "{info}"
    );
    let link = cli_ok(&d, &["dashboard"]);
    assert!(link.contains("http://127.0.0.1:"), "{link}");
    for (flag, addr, want) in [
        (
            "--http",
            "no-such-host.invalid:8080",
            "cannot resolve 'no-such-host.invalid:8080'",
        ),
        ("--api-listen", "localhost", "'localhost' has no port"),
        ("--nbd-listen", "localhost:http", "has no port"),
    ] {
        let out = run(ramd().args(["daemon", "--no-config", flag, addr])).failed();
        assert_eq!(out.code(), 2, "{out}");
        assert!(out.stderr.contains(want), "{flag} {addr}: {out}");
    }
}

/// `ramd info CACHE` asks for a drive first, then for the cache: the 404
/// of the first question is no failure to log. Other refusals still are.
#[test]
fn info_of_a_cache_logs_no_failed_request() {
    let d = Daemon::start(&["a=16M"]);
    let backing = d.dir().join("backing.img");
    std::fs::File::create(&backing)
        .and_then(|f| f.set_len(32 << 20))
        .unwrap();
    cli_ok(
        &d,
        &[
            "cache",
            "create",
            "c",
            "--backing",
            backing.to_str().unwrap(),
            "--size",
            "8M",
            "--mode",
            "writethrough",
        ],
    );
    let out = cli_ok(&d, &["info", "c"]);
    assert!(out.contains("writethrough"), "{out}");
    cli_fails(&d, &["info", "nosuch"], 1, "no drive named 'nosuch'");
    let (status, _) = d.http("POST", "/v1/drives", Some(r#"{"name":"x","size":"12Q"}"#));
    assert_eq!(status, 422);
    // Every earlier request's line is there once the 422's is.
    let log = d.wait_log("the 422", |l| l.contains("status=422"));
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("API request failed"))
        .collect();
    assert_eq!(failed.len(), 1, "only the 422 is a failure:\n{log}");
    assert!(failed[0].contains("status=422"), "{log}");
}

/// `ramd install-units` will not point units into a cargo build tree
/// (the next build replaces the binary, `cargo clean` removes it) unless
/// --bin names it on purpose; --dry-run and --bin warn instead.
#[test]
fn install_units_refuses_a_binary_in_the_build_tree() {
    let dir = tempfile::tempdir().unwrap();
    let units = dir.path().join("units");
    let conf = dir.path().join("ramd.toml");
    std::fs::write(&conf, "").unwrap();
    let bin = std::path::PathBuf::from(ramd().get_program());
    let base = |extra: &[&str]| {
        let mut c = ramd();
        c.env("RAMD_API_SOCKET", dir.path().join("api.sock"))
            .args(["install-units", "--dir", units.to_str().unwrap()])
            .args(["--config", conf.to_str().unwrap()])
            .args(extra);
        c
    };
    let out = run(&mut base(&[])).failed();
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stderr.contains("cargo build tree") && out.stderr.contains("install -m 0755"),
        "{out}"
    );
    assert!(!units.exists(), "refused, yet wrote units");
    let out = run(&mut base(&["--dry-run"])).ok();
    assert!(
        out.stderr.contains("warning") && out.stderr.contains("build tree"),
        "{out}"
    );
    assert!(!units.exists(), "--dry-run wrote units");
    let out = run(&mut base(&["--bin", bin.to_str().unwrap()])).ok();
    assert!(
        out.stderr.contains("warning") && out.stderr.contains("build tree"),
        "{out}"
    );
    let service = std::fs::read_to_string(units.join("ramd.service")).unwrap();
    assert!(
        service.contains(&format!("ExecStart={} daemon", bin.display())),
        "{service}"
    );
}
