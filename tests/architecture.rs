//! The shape of src/ never gets worse: import circles between files,
//! functions over 120 lines, stringly-typed errors outside the HTTP edge and
//! layer breaks (api/wire importing the server side, api/client importing
//! more than wire, cli importing more than the client, wire and the pure
//! helpers; see LAYERS in the script) are counted by scripts/arch_check.py,
//! and each count may only go down. So may the circles of the one allowed
//! pattern (a parent mod.rs that holds what its children share and is also
//! their facade; the script's rule 1 says why it is allowed).
//! When a count drops, lower its ceiling here in the same commit, so the
//! gain is kept; the goal for each is 0.

use std::process::Command;

/// Ceilings: (what the script prints before the count, the most allowed).
const CEILINGS: &[(&str, usize)] = &[
    ("import circles: ", 0),
    ("parent/child circles (allowed): ", 11),
    ("functions over 120 lines: ", 0),
    ("stringly-typed errors outside the HTTP edge: ", 0),
    ("layer breaks: ", 0),
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

/// Rules 1 (circles) and 4 (layers) catch what they should: on small
/// made-up trees the script finds exactly the circles and breaks planted
/// in them (a circle between siblings, one that closes up and sideways
/// through a parent; `use child::X` paths resolved), and counts the
/// allowed parent/child pattern apart, so the ceilings above mean
/// something.
#[test]
fn the_circle_and_layer_rules_catch_planted_breaks() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("/usr/bin/python3")
        .arg(format!("{root}/scripts/arch_check.py"))
        .arg("--self-test")
        .output()
        .expect("run scripts/arch_check.py with /usr/bin/python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The benchmarks and scripts run from a clone of this repository alone:
/// nothing in bench/, scripts/ or .ci/ reaches outside it.
#[test]
fn bench_scripts_and_ci_are_self_contained() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["bench", "scripts", ".ci"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if !path.is_file() || path.extension().is_some_and(|e| e == "json") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            assert!(
                !text.contains("../shared"),
                "{} refers to files outside the repository",
                path.display()
            );
        }
    }
}

/// README's quick start makes every file it uses, and takes socket paths
/// from ramd instead of hard-coding /run/ramd (wrong when XDG_RUNTIME_DIR
/// is set, root included).
#[test]
fn readme_quick_start_creates_what_it_uses() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    if let Some(used) = readme.find("disk.img") {
        let made = readme
            .find("truncate -s")
            .or_else(|| readme.find("qemu-img create"))
            .expect("README uses disk.img but never creates it");
        assert!(made < used, "README creates disk.img only after using it");
    }
    let start = readme
        .find("## The first five minutes")
        .expect("a quick start");
    let end = readme[start + 3..]
        .find("\n## ")
        .map_or(readme.len(), |i| start + 3 + i);
    assert!(
        !readme[start..end].contains("socket=/run/ramd"),
        "the quick start hard-codes /run/ramd socket paths"
    );
}
