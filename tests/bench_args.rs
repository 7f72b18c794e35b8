//! `ramd bench` refuses what it cannot do before it runs, not after: a
//! target that does not exist (it would measure the filesystem holding
//! the name), a plot it could not write; and off a terminal it says how
//! far it got on stderr.

mod common;

use common::*;

/// `ramd bench ARGS` (no daemon needed for --compare alone).
fn bench(args: &[&str]) -> Output {
    let mut cmd = ramd();
    cmd.env("RAMD_API_SOCKET", "/nonexistent/api.sock")
        .arg("bench")
        .args(args);
    run(&mut cmd)
}

#[test]
fn a_target_that_does_not_exist_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("mnt/missing");
    for path in [missing.clone(), dir.path().join("missing")] {
        let out = bench(&["--compare", path.to_str().unwrap(), "--destructive"]);
        let out = out.failed();
        assert!(out.stderr.contains("does not exist"), "{out}");
        assert!(!path.exists(), "{} was created", path.display());
    }
}

#[test]
fn a_bad_plot_path_is_found_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--compare",
        dir.path().to_str().unwrap(),
        "--plot",
        "/nonexistent/dir/plot.svg",
        "--runtime",
        "1s",
    ])
    .failed();
    assert!(out.stderr.contains("/nonexistent/dir"), "{out}");
    // Refused before any run (each run prints a line off a terminal).
    assert!(
        !out.stderr.contains("ramd bench: run"),
        "a run started: {out}"
    );
}

#[test]
fn off_a_terminal_progress_goes_to_stderr_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&[
        "--compare",
        dir.path().to_str().unwrap(),
        "--test",
        "randread-4k-qd1",
        "--test",
        "randwrite-4k-qd1",
        "--runtime",
        "200ms",
        "--size",
        "16M",
    ])
    .ok();
    assert!(
        out.stderr
            .contains("ramd bench: run 1/2 randread-4k-qd1 on"),
        "{out}"
    );
    assert!(
        out.stderr
            .contains("ramd bench: run 2/2 randwrite-4k-qd1 on"),
        "{out}"
    );
    assert!(
        out.stderr.contains("ramd bench: done randwrite-4k-qd1"),
        "{out}"
    );
    assert!(out.stdout.contains("randread-4k-qd1"), "{out}");
}
