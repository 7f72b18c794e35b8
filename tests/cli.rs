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
        1,
        "unknown size unit",
    );
    cli_fails(
        &d,
        &["create", "Bad", "--size", "1M"],
        1,
        "invalid drive name",
    );

    // list
    let table = cli_ok(&d, &["list"]);
    let r = rows(&table);
    assert_eq!(
        r[0],
        ["NAME", "SIZE", "USED", "LIMIT", "MODE", "CONNS", "ATTACHED", "URI"],
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
        ["NAME", "IOPS R/W", "MiB/s R/W", "READ p50/p99"],
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
    cli_fails(&d, &["resize", "db", "0"], 1, "at least 1 byte");
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
