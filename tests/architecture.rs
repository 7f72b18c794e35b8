//! The shape of src/ never gets worse: import circles between files,
//! functions over 120 lines and stringly-typed errors outside the HTTP edge
//! are counted by scripts/arch_check.py, and each count may only go down.
//! When a count drops, lower its ceiling here in the same commit, so the
//! gain is kept; the goal for each is 0.

use std::process::Command;

/// Ceilings: (what the script prints before the count, the most allowed).
const CEILINGS: &[(&str, usize)] = &[
    ("import circles: ", 5),
    ("functions over 120 lines: ", 0),
    ("stringly-typed errors outside the HTTP edge: ", 7),
];

#[test]
fn the_shape_of_src_does_not_get_worse() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("/usr/bin/python3")
        .arg(format!("{root}/scripts/arch_check.py"))
        .arg("--report")
        .output()
        .expect("run scripts/arch_check.py with /usr/bin/python3");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text.lines().next().unwrap_or_default();
    for (label, ceiling) in CEILINGS {
        let count: usize = summary
            .split(';')
            .find_map(|part| part.trim().strip_prefix(label.trim_start()))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{label}' count in: {summary}"));
        assert!(
            count <= *ceiling,
            "{label}{count}, more than the {ceiling} allowed:\n{text}"
        );
    }
}
