//! Real-client integration tests: each test starts the `ramd` binary in a
//! temporary directory and drives it with the tools users run against it
//! (nbdinfo, qemu-img, qemu-io, nbdcopy, nbdsh, fio, nbdfuse + losetup +
//! ext4). They catch what unit tests cannot: handshake details real clients
//! depend on, flag advertisement, multi-connection use and shutdown.
//!
//! A missing tool fails its test (see `common::require`); set
//! RAMD_SKIP_MISSING_TOOLS=1 to skip instead. `scripts/test-deps.sh`
//! installs everything on Debian 12.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{
    ramd, random_bytes, require, run, tool, try_run, wait_timeout, wait_until, Daemon, KillOnDrop,
    WAIT_TIMEOUT,
};

const MIB: usize = 1 << 20;

// ---------------------------------------------------------------- helpers --

/// The value of `"key": value` in nbdinfo's JSON, whose layout is one field
/// per line. Good enough without a JSON parser dev-dependency.
fn json_value<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":");
    let rest = &json[json.find(&pat)? + pat.len()..];
    let end = rest.find([',', '\n', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// `nbdinfo --can X` / `--is X`: exit 0 means true, 2 false, anything else
/// is an error (which fails the test).
fn nbdinfo_flag(kind: &str, what: &str, uri: &str) -> bool {
    let out = run(tool("nbdinfo").args([kind, what, uri]));
    match out.code() {
        0 => true,
        2 => false,
        _ => panic!("nbdinfo {kind} {what} failed: {out}"),
    }
}

/// One line of `nbdinfo --map`: offset, length, type flags, description.
#[derive(Debug, PartialEq, Eq)]
struct MapEntry {
    offset: u64,
    len: u64,
    flags: u32,
    desc: String,
}

fn map_entry(offset: u64, len: u64, flags: u32, desc: &str) -> MapEntry {
    MapEntry {
        offset,
        len,
        flags,
        desc: desc.into(),
    }
}

fn nbdinfo_map(uri: &str) -> Vec<MapEntry> {
    let out = run(tool("nbdinfo").args(["--map", uri])).ok();
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let num = |i: usize| -> u64 {
                f.get(i)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("bad nbdinfo --map line {l:?}"))
            };
            MapEntry {
                offset: num(0),
                len: num(1),
                flags: num(2) as u32,
                desc: f[3..].join(" "),
            }
        })
        .collect()
}

/// Runs qemu-io on a raw NBD image with one `-c` per command.
fn qemu_io(uri: &str, commands: &[&str]) -> common::Output {
    let mut cmd = tool("qemu-io");
    cmd.args(["-f", "raw"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    run(cmd.arg(uri))
}

/// qemu-io commands that must all succeed, including every `-P` check.
#[track_caller]
fn qemu_io_ok(uri: &str, commands: &[&str]) {
    let out = qemu_io(uri, commands);
    // Older qemu-io versions exit 0 even when a command fails, so the output
    // is checked too.
    assert!(
        out.status.success()
            && !out.stdout.contains("verification failed")
            && !out.stderr.contains("error"),
        "qemu-io reported a failure: {out}"
    );
}

/// Removes the indentation common to all non-blank lines, so Python embedded
/// in Rust source can be indented with the code around it.
fn dedent(text: &str) -> String {
    let indent = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    text.lines()
        .map(|l| l.get(indent..).unwrap_or("").trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Printed by the nbdsh prelude's last line: proves the whole script ran.
const NBDSH_DONE: &str = "NBDSH-SCRIPT-DONE";

/// Runs a Python script in nbdsh against `uri`. The prelude connects `h` with
/// base:allocation and defines `extents(offset, count)` -> merged
/// [(length, flags)] and `expect_err(errno, label, fn)`. The script fails the
/// test by raising (a failed `assert` or an nbd.Error).
#[track_caller]
fn nbdsh(uri: &str, script: &str) -> common::Output {
    let prelude = dedent(&format!(
        r#"
        import errno
        h = nbd.NBD()
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        h.connect_uri({uri:?})

        def extents(offset, count):
            """Merged (length, flags) runs of base:allocation over the range;
            asks again when the server describes only a prefix."""
            runs = []
            pos, end = offset, offset + count
            while pos < end:
                got = []
                def cb(meta, off, entries, err):
                    assert meta == nbd.CONTEXT_BASE_ALLOCATION, meta
                    got.extend(zip(entries[0::2], entries[1::2]))
                    return 0
                h.block_status(end - pos, pos, cb)
                assert got, "empty block status reply at %d" % pos
                for length, flags in got:
                    length = min(length, end - pos)
                    assert length > 0, "zero-length extent at %d: %r" % (pos, got)
                    if runs and runs[-1][1] == flags:
                        runs[-1][0] += length
                    else:
                        runs.append([length, flags])
                    pos += length
                    if pos == end:
                        break
            return [tuple(r) for r in runs]

        def expect_err(code, label, fn):
            try:
                fn()
            except nbd.Error as e:
                assert e.errnum == code, "%s: expected %s, got %s" % (
                    label, errno.errorcode[code], e)
                return
            raise AssertionError("%s succeeded; expected %s" % (label, errno.errorcode[code]))

        HOLE_ZERO = nbd.STATE_HOLE | nbd.STATE_ZERO
        "#
    ));
    let full = format!(
        "{prelude}\n{}\nh.shutdown()\nprint({NBDSH_DONE:?})\n",
        dedent(script)
    );
    let out = run(tool("nbdsh").args(["-n", "-c", &full]));
    if !(out.status.success() && out.stdout.contains(NBDSH_DONE)) {
        // Number the lines: Python's traceback cites them as "<string>", N.
        let listing: Vec<String> = full
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{:4} {l}", i + 1))
            .collect();
        panic!(
            "nbdsh script failed ({}) against {uri}\n--- script ---\n{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            listing.join("\n"),
            out.stdout,
            out.stderr
        );
    }
    out
}

/// Writes `data` to a new file in `dir`.
fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

#[track_caller]
fn assert_same_file(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert_eq!(
        x.len(),
        y.len(),
        "{} and {} differ in size",
        a.display(),
        b.display()
    );
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{} and {} differ at byte {i}", a.display(), b.display());
    }
}

/// Random data with a zero run in the middle, so copies see both data and a
/// zero area (which clients may send as WRITE_ZEROES or TRIM).
fn sparse_random(len: usize, seed: u64) -> Vec<u8> {
    let mut data = random_bytes(len, seed);
    data[len / 4..len / 2].fill(0);
    data
}

// ---------------------------------------------------------------- nbdinfo --

#[test]
fn nbdinfo_json_reports_size_flags_block_sizes_and_contexts() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let d = Daemon::start(&["ram0=64M", "ro=1M,read-only"]);
    let json = run(tool("nbdinfo").args(["--json", &d.uri("ram0")]))
        .ok()
        .stdout;
    for (key, want) in [
        ("export-size", "67108864"),
        ("is_read_only", "false"),
        ("can_multi_conn", "true"),
        ("can_trim", "true"),
        ("can_zero", "true"),
        ("can_fast_zero", "true"),
        ("can_flush", "true"),
        ("can_fua", "true"),
        ("can_cache", "true"),
        ("can_df", "true"),
        ("structured", "true"),
        ("block_size_minimum", "1"),
        ("block_size_preferred", "4096"),
        ("block_size_maximum", "33554432"),
    ] {
        assert_eq!(json_value(&json, key), Some(want), "{key} in:\n{json}");
    }
    assert!(json.contains("\"base:allocation\""), "contexts in:\n{json}");

    let ro = run(tool("nbdinfo").args(["--json", &d.uri("ro")]))
        .ok()
        .stdout;
    assert_eq!(json_value(&ro, "is_read_only"), Some("true"), "{ro}");
    // Like nbdkit and qemu-nbd: nothing that changes data is offered.
    for key in ["can_trim", "can_zero", "can_fua"] {
        assert_eq!(
            json_value(&ro, key),
            Some("false"),
            "{key} in:
{ro}"
        );
    }
    assert_eq!(json_value(&ro, "export-size"), Some("1048576"), "{ro}");

    // The scriptable forms: --size, and --can/--is exit codes.
    let size = run(tool("nbdinfo").args(["--size", &d.uri("ram0")])).ok();
    assert_eq!(size.stdout.trim(), "67108864");
    // The empty export name is the first drive.
    let size = run(tool("nbdinfo").args(["--size", &d.uri("")])).ok();
    assert_eq!(size.stdout.trim(), "67108864");
    for can in [
        "trim",
        "zero",
        "fast-zero",
        "flush",
        "fua",
        "cache",
        "multi-conn",
        "write",
    ] {
        assert!(nbdinfo_flag("--can", can, &d.uri("ram0")), "--can {can}");
    }
    assert!(!nbdinfo_flag("--is", "read-only", &d.uri("ram0")));
    assert!(nbdinfo_flag("--is", "read-only", &d.uri("ro")));
    assert!(!nbdinfo_flag("--can", "write", &d.uri("ro")));
}

#[test]
fn nbdinfo_list_shows_every_drive_and_first_is_default() {
    if !require(&["nbdinfo"]) {
        return;
    }
    // Not in name order: the default export must be the first *given*.
    let d = Daemon::start(&["zeta=3M", "alpha=1M", "mid=2M,read-only"]);
    let out = run(tool("nbdinfo").args(["--list", &d.uri("")])).ok();
    let sections: Vec<&str> = out.stdout.split("export=\"").skip(1).collect();
    assert_eq!(sections.len(), 3, "three exports expected:\n{}", out.stdout);
    for (name, size, mib) in [
        ("zeta", 3 << 20, 3),
        ("alpha", 1 << 20, 1),
        ("mid", 2 << 20, 2),
    ] {
        let s = sections
            .iter()
            .find(|s| s.starts_with(&format!("{name}\"")))
            .unwrap_or_else(|| panic!("export {name} missing from:\n{}", out.stdout));
        assert!(s.contains(&format!("export-size: {size} ")), "{name}: {s}");
        assert!(
            s.contains(&format!("ramd RAM drive, {mib} MiB")),
            "{name}: {s}"
        );
    }
    let default = run(tool("nbdinfo").args(["--size", &d.uri("")])).ok();
    assert_eq!(default.stdout.trim(), (3 << 20).to_string());
}

#[test]
fn nbdinfo_map_tracks_writes_and_trims() {
    if !require(&["nbdinfo", "qemu-io"]) {
        return;
    }
    let d = Daemon::start(&["ram0=1M"]);
    let uri = d.uri("ram0");
    let all_hole = vec![map_entry(0, 1 << 20, 3, "hole,zero")];
    assert_eq!(nbdinfo_map(&uri), all_hole, "a fresh drive is one hole");

    qemu_io_ok(&uri, &["write -P 0x5a 131072 65536"]);
    assert_eq!(
        nbdinfo_map(&uri),
        vec![
            map_entry(0, 131072, 3, "hole,zero"),
            map_entry(131072, 65536, 0, "data"),
            map_entry(196608, (1 << 20) - 196608, 3, "hole,zero"),
        ]
    );
    // A 10-byte write allocates its whole 4 KiB page.
    qemu_io_ok(&uri, &["write -P 1 1000 10"]);
    assert_eq!(nbdinfo_map(&uri)[0], map_entry(0, 4096, 0, "data"));

    qemu_io_ok(&uri, &["discard 0 1048576"]);
    assert_eq!(nbdinfo_map(&uri), all_hole, "a trimmed drive is one hole");
}

// ------------------------------------------------------------------- qemu --

#[test]
fn qemu_img_convert_and_compare_round_trip() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let d = Daemon::start(&["ram0=32M"]);
    let uri = d.uri("ram0");
    let src = write_file(d.dir(), "src.img", &sparse_random(32 * MIB, 1));

    // In: -n because the drive exists (qemu-img must not try to create it).
    run(tool("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(&uri))
    .ok();
    // Compare both ways round (exit 0: identical).
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri))
    .ok();
    run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&uri)
        .arg(&src))
    .ok();

    // Out, and byte-for-byte equal.
    let back = d.dir().join("back.img");
    run(tool("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(&uri)
        .arg(&back))
    .ok();
    assert_same_file(&src, &back);

    // Control: compare must notice a change, or the checks above prove nothing.
    qemu_io_ok(&uri, &["write -P 0x5a 1048576 512"]);
    let diff = run(tool("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri));
    assert_eq!(diff.code(), 1, "compare should report a difference: {diff}");
    assert!(diff.stdout.contains("1048576"), "{diff}");
}

#[test]
fn qemu_io_aligned_unaligned_discard_and_zero_with_pattern_checks() {
    if !require(&["qemu-io"]) {
        return;
    }
    let d = Daemon::start(&["ram0=4M"]);
    let uri = d.uri("ram0");
    qemu_io_ok(
        &uri,
        &[
            // Aligned, and its untouched neighbours.
            "write -P 0xab 4096 8192",
            "read -P 0xab 4096 8192",
            "read -P 0 0 4096",
            "read -P 0 12288 4096",
            // Unaligned inside a fresh page; the rest of the page stays zero.
            "write -P 0x11 1000 3000",
            "read -P 0 0 1000",
            "read -P 0x11 1000 3000",
            "read -P 0 4000 96",
            "read -P 0xab 4096 8192",
            // Across the 64 KiB lock-stripe boundary, unaligned both ends.
            "write -P 0x33 65530 12",
            "read -P 0 65520 10",
            "read -P 0x33 65530 12",
            "read -P 0 65542 10",
            // Discard reads back as zeroes (ramd promises it), partial pages
            // included; bytes around it are kept.
            "discard 6000 4000",
            "read -P 0xab 4096 1904",
            "read -P 0 6000 4000",
            "read -P 0xab 10000 2288",
            "discard 0 131072",
            "read -P 0 0 131072",
            // Write zeroes: with and without permission to unmap.
            "write -P 0xcd 131072 65536",
            "write -z 131072 8192",
            "write -z -u 139264 8192",
            "read -P 0 131072 16384",
            "read -P 0xcd 147456 49152",
            // Last bytes of the drive.
            "write -P 0xee 4194300 4",
            "read -P 0xee 4194300 4",
        ],
    );

    // Controls: a wrong pattern must fail, so the checks above are not vacuous.
    for wrong in ["read -P 0xcc 147456 4096", "read -P 0 4194300 4"] {
        let out = qemu_io(&uri, &[wrong]);
        assert!(
            !out.status.success() && out.stdout.contains("Pattern verification failed"),
            "{wrong} should fail: {out}"
        );
    }
}

// ---------------------------------------------------------------- nbdcopy --

#[test]
fn nbdcopy_file_to_drive_to_file_and_drive_to_drive() {
    if !require(&["nbdcopy"]) {
        return;
    }
    let d = Daemon::start(&["a=16M", "b=16M"]);
    let (a, b) = (d.uri("a"), d.uri("b"));
    let src = write_file(d.dir(), "src.img", &sparse_random(16 * MIB, 2));
    let out_a = d.dir().join("out-a.img");
    let out_b = d.dir().join("out-b.img");

    run(tool("nbdcopy").arg(&src).arg(&a)).ok();
    run(tool("nbdcopy").arg(&a).arg(&out_a)).ok();
    assert_same_file(&src, &out_a);
    // nbd -> nbd: both ends are ramd (multi-conn on both), with a final flush.
    run(tool("nbdcopy").args(["--flush", &a, &b])).ok();
    run(tool("nbdcopy").arg(&b).arg(&out_b)).ok();
    assert_same_file(&src, &out_b);
}

// ------------------------------------------------------------------ nbdsh --

#[test]
fn nbdsh_trim_zero_cache_flush_fua_and_block_status() {
    if !require(&["nbdsh"]) {
        return;
    }
    let d = Daemon::start(&["ram0=1M"]);
    nbdsh(
        &d.uri("ram0"),
        r#"
        size = h.get_size()
        assert size == 1 << 20
        for can in (h.can_trim, h.can_zero, h.can_fast_zero, h.can_flush,
                    h.can_fua, h.can_cache, h.can_multi_conn, h.can_df):
            assert can(), can.__name__
        assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        assert extents(0, size) == [(size, HOLE_ZERO)], extents(0, size)

        # A write allocates its pages: data, no hole/zero flags.
        h.pwrite(b"x" * 8192, 0)
        assert extents(0, size) == [(8192, 0), (size - 8192, HOLE_ZERO)], extents(0, size)

        # Trim of one page makes a hole that reads as zero.
        h.trim(4096, 4096)
        assert h.pread(4096, 4096) == bytes(4096)
        assert h.pread(4096, 0) == b"x" * 4096
        assert extents(0, 12288) == [(4096, 0), (8192, HOLE_ZERO)], extents(0, 12288)

        # Zero may punch a hole...
        h.pwrite(b"y" * 8192, 16384)
        h.zero(8192, 16384)
        assert h.pread(8192, 16384) == bytes(8192)
        assert extents(16384, 8192) == [(8192, HOLE_ZERO)], extents(16384, 8192)

        # ...but not with NO_HOLE: the range stays allocated, reading zero.
        h.pwrite(b"z" * 8192, 32768)
        h.zero(8192, 32768, nbd.CMD_FLAG_NO_HOLE)
        assert h.pread(8192, 32768) == bytes(8192)
        ext = extents(32768, 8192)
        assert all(f & nbd.STATE_HOLE == 0 for _, f in ext), ext

        # FAST_ZERO is advertised, so it must be accepted, alone and with NO_HOLE.
        h.pwrite(b"f" * 8192, 49152)
        h.zero(4096, 49152, nbd.CMD_FLAG_FAST_ZERO)
        h.zero(4096, 53248, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
        assert h.pread(8192, 49152) == bytes(8192)

        # Unaligned trim and zero keep the bytes around them.
        h.pwrite(b"u" * 12288, 65536)
        h.trim(5000, 65536 + 100)
        h.zero(300, 65536 + 9000, nbd.CMD_FLAG_FUA)
        got = h.pread(12288, 65536)
        want = b"u" * 100 + bytes(5000) + b"u" * 3900 + bytes(300) + b"u" * 2988
        assert got == want

        # FUA write, trim with FUA, cache, flush.
        h.pwrite(b"F" * 4096, 131072, nbd.CMD_FLAG_FUA)
        assert h.pread(4096, 131072) == b"F" * 4096
        h.trim(4096, 131072, nbd.CMD_FLAG_FUA)
        h.cache(size, 0)
        h.flush()

        # REQ_ONE: a single extent, starting at the offset asked for.
        one = []
        h.block_status(size, 0, lambda m, o, e, err: one.append(list(e)) or 0,
                       nbd.CMD_FLAG_REQ_ONE)
        assert len(one) == 1 and len(one[0]) == 2 and one[0] == [4096, 0], one
        "#,
    );
}

#[test]
fn nbdsh_read_only_drive_refuses_writes_with_eperm() {
    if !require(&["nbdsh"]) {
        return;
    }
    let d = Daemon::start(&["rw=1M", "ro=1M,read-only"]);
    nbdsh(
        &d.uri("ro"),
        r#"
        assert h.is_read_only()
        # libnbd refuses on its own, from the advertised read-only flag...
        expect_err(errno.EPERM, "pwrite (client check)", lambda: h.pwrite(b"w", 0))
        # ...so turn its checks off to see the server refuse too.
        h.set_strict_mode(0)
        expect_err(errno.EPERM, "pwrite", lambda: h.pwrite(b"w" * 4096, 0))
        expect_err(errno.EPERM, "pwrite FUA", lambda: h.pwrite(b"w", 9, nbd.CMD_FLAG_FUA))
        expect_err(errno.EPERM, "trim", lambda: h.trim(4096, 0))
        expect_err(errno.EPERM, "zero", lambda: h.zero(4096, 0))
        # Reads, flush and block status still work; nothing was written.
        assert h.pread(4096, 0) == bytes(4096)
        h.flush()
        assert extents(0, h.get_size()) == [(h.get_size(), HOLE_ZERO)]
        "#,
    );
}

#[test]
fn nbdsh_requests_past_the_end_fail() {
    if !require(&["nbdsh"]) {
        return;
    }
    // A size that is not a multiple of the 4 KiB page, to test the last one.
    let d = Daemon::start(&["odd=1000000"]);
    nbdsh(
        &d.uri("odd"),
        r#"
        size = h.get_size()
        assert size == 1000000
        # Right up to the end is fine.
        h.pwrite(b"e" * 10, size - 10)
        assert h.pread(10, size - 10) == b"e" * 10
        assert extents(0, size)[-1] == (size % 4096, 0), extents(0, size)
        h.zero(10, size - 10)
        h.trim(10, size - 10)
        # libnbd checks bounds itself...
        expect_err(errno.ENOSPC, "pwrite past end (client)", lambda: h.pwrite(b"e" * 11, size - 10))
        # ...so turn that off to see the server's answers: ENOSPC for writes
        # (as the NBD spec asks), EINVAL for the rest.
        h.set_strict_mode(0)
        expect_err(errno.ENOSPC, "pwrite straddling end", lambda: h.pwrite(b"e" * 11, size - 10))
        expect_err(errno.ENOSPC, "pwrite at end", lambda: h.pwrite(b"e", size))
        expect_err(errno.ENOSPC, "pwrite far past end", lambda: h.pwrite(b"e", 1 << 40))
        expect_err(errno.ENOSPC, "zero past end", lambda: h.zero(4096, size - 100))
        expect_err(errno.EINVAL, "pread past end", lambda: h.pread(11, size - 10))
        expect_err(errno.EINVAL, "trim past end", lambda: h.trim(4096, size - 100))
        expect_err(errno.EINVAL, "cache past end", lambda: h.cache(4096, size - 100))
        # The refused write changed nothing and the connection still works.
        assert h.pread(10, size - 10) == bytes(10)
        "#,
    );
}

#[test]
fn nbdsh_mem_limit_gives_enospc_while_overwrites_and_trims_work() {
    if !require(&["nbdsh", "nbdinfo"]) {
        return;
    }
    let mut d = Daemon::start(&["small=1M,mem-limit=64K", "other=1M"]);
    let uri = d.uri("small");
    nbdsh(
        &uri,
        r#"
        page = 4096
        for i in range(16):
            h.pwrite(bytes([i + 1]) * page, i * page)
        # The 17th page is over the 64 KiB limit.
        expect_err(errno.ENOSPC, "write past mem-limit", lambda: h.pwrite(b"n" * page, 16 * page))
        expect_err(errno.ENOSPC, "zero NO_HOLE past mem-limit",
                   lambda: h.zero(page, 20 * page, nbd.CMD_FLAG_NO_HOLE))
        # Overwrites need no new memory, whole pages or parts of them.
        h.pwrite(b"o" * page, 0)
        h.pwrite(b"p" * 10, 5 * page + 7)
        assert h.pread(page, 0) == b"o" * page
        assert h.pread(12, 5 * page + 6) == bytes([6]) + b"p" * 10 + bytes([6])
        assert h.pread(page, 16 * page) == bytes(page), "refused write left data"
        # A trim gives memory back: one new page fits again, a second does not.
        h.trim(page, 15 * page)
        h.pwrite(b"q" * page, 100 * page)
        expect_err(errno.ENOSPC, "write past mem-limit again", lambda: h.pwrite(b"r" * page, 101 * page))
        assert h.pread(page, 100 * page) == b"q" * page
        "#,
    );
    // The daemon keeps serving: new connections, both drives, same data.
    assert!(d.is_running(), "ramd died:\n{}", d.log());
    nbdsh(
        &uri,
        r#"
        assert h.pread(4096, 0) == b"o" * 4096
        assert h.pread(4096, 100 * 4096) == b"q" * 4096
        "#,
    );
    let map = nbdinfo_map(&uri);
    let data: u64 = map.iter().filter(|e| e.flags == 0).map(|e| e.len).sum();
    assert_eq!(data, 64 << 10, "exactly the limit is allocated: {map:?}");
    // The limit is per drive: the other drive is not affected.
    nbdsh(&d.uri("other"), "h.pwrite(b'x' * (256 * 1024), 0)");
}

/// Large WRITEs refused for lack of memory (mem-limit or daemon budget) or
/// for size get their error only after the daemon read their payload:
/// libnbd cannot take an early reply and would drop the connection ("no
/// matching cookie"). The handle stays usable after each refusal.
#[test]
fn nbdsh_large_writes_refused_for_memory_or_size_keep_the_connection() {
    if !require(&["nbdsh"]) {
        return;
    }
    let script = r#"
        h.pwrite(b"a" * (1 << 20), 0)
        for n in (64 << 10, 1 << 20, 32 << 20):
            expect_err(errno.ENOSPC, "pwrite of %d bytes" % n,
                       lambda: h.pwrite(b"w" * n, 16 << 20))
            assert h.pread(4096, 0) == b"a" * 4096, "handle broken after %d" % n
        # Over the 32 MiB maximum: EINVAL, payload drained, handle alive.
        h.set_strict_mode(0)
        expect_err(errno.EINVAL, "pwrite of 33 MiB", lambda: h.pwrite(b"x" * (33 << 20), 0))
        assert h.pread(4096, 0) == b"a" * 4096
        "#;
    let limit = Daemon::start(&["small=64M,mem-limit=1M"]);
    nbdsh(&limit.uri("small"), script);
    let budget = Daemon::launch(
        &[
            "serve".into(),
            "--mem-budget".into(),
            "1M".into(),
            "--drive".into(),
            "big=64M,overcommit".into(),
        ],
        &[],
    );
    nbdsh(&budget.uri("big"), script);
}

/// fio (libnbd) and qemu-img writing past a full mem-limit get ENOSPC, not
/// a dropped connection, at 64 KiB, 1 MiB and 32 MiB blocks.
#[test]
fn fio_and_qemu_img_large_writes_past_a_full_mem_limit_get_enospc() {
    if !require(&["fio", "qemu-img"]) {
        return;
    }
    let mut d = Daemon::start(&["small=96M,mem-limit=1M"]);
    for bs in ["64k", "1m", "32m"] {
        let out = try_run(
            tool("fio")
                .current_dir(d.dir())
                .args(["--ioengine=nbd", "--name=full", "--rw=write", "--size=64M"])
                .arg(format!("--bs={bs}"))
                .arg(format!("--uri={}", d.uri("small"))),
            Duration::from_secs(120),
        )
        .expect("fio ran");
        let text = format!("{}{}", out.stdout, out.stderr);
        assert!(
            !text.contains("no matching cookie") && !text.contains("connection is dead"),
            "bs={bs}: the connection died instead of an ENOSPC reply: {text}"
        );
        assert!(
            text.contains("No space left on device") || text.contains("err=28"),
            "bs={bs}: fio should see ENOSPC: {text}"
        );
    }
    let img = d.dir().join("src.img");
    std::fs::write(&img, random_bytes(8 * MIB, 7)).unwrap();
    let out = try_run(
        tool("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&img)
            .arg(d.uri("small")),
        Duration::from_secs(120),
    )
    .expect("qemu-img ran");
    assert!(!out.status.success(), "qemu-img should fail: {out}");
    assert!(
        out.stderr.contains("No space left on device"),
        "qemu-img should report ENOSPC: {out}"
    );
    assert!(d.is_running(), "ramd died:\n{}", d.log());
}

// -------------------------------------------------------------------- fio --

/// Runs fio with the nbd ioengine (libnbd, one connection per job) and checks
/// every job ended without error.
fn fio_ok(d: &Daemon, export: &str, args: &[&str], jobs: usize) {
    let out = run(tool("fio")
        // Verify state files land in the cwd: keep them in the temp dir.
        .current_dir(d.dir())
        .args([
            "--ioengine=nbd",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ])
        .arg(format!("--uri={}", d.uri(export)))
        .args(args))
    .ok();
    let clean = out.stdout.matches("err= 0").count();
    assert_eq!(clean, jobs, "every fio job should report err= 0: {out}");
    assert!(
        !out.stdout.contains("verify") && !out.stderr.contains("verify"),
        "{out}"
    );
}

#[test]
fn fio_multi_conn_randrw_with_crc32c_verify() {
    if !require(&["fio"]) {
        return;
    }
    let d = Daemon::start(&["ram0=64M"]);
    // Four jobs, each its own NBD connection, on disjoint 8 MiB regions so
    // each job's verification sees only its own writes.
    fio_ok(
        &d,
        "ram0",
        &[
            "--name=randrw",
            "--rw=randrw",
            "--bs=4k",
            "--verify=crc32c",
            "--numjobs=4",
            "--iodepth=16",
            "--size=8M",
            "--offset_increment=8M",
        ],
        4,
    );
}

#[test]
fn fio_sequential_1m_write_with_verify() {
    if !require(&["fio"]) {
        return;
    }
    let d = Daemon::start(&["ram0=64M"]);
    fio_ok(
        &d,
        "ram0",
        &[
            "--name=seq1m",
            "--rw=write",
            "--bs=1M",
            "--verify=crc32c",
            "--iodepth=4",
            "--size=48M",
        ],
        1,
    );
}

// ------------------------------------------------------------ ext4 on FUSE --

/// The block stack of the ext4 test: nbdfuse exposes the drive as the file
/// FUSE_DIR/nbd, a loop device turns that into a block device, and ext4 is
/// mounted from it. `teardown` takes it apart step by step, checking each
/// step; if the test fails first, `Drop` kills nbdfuse *before* anything else,
/// so pending FUSE requests fail at once instead of leaving the unmount or
/// detach blocked in the kernel, then unmounts and detaches what is left.
struct Ext4Stack {
    fuse_dir: PathBuf,
    mnt: PathBuf,
    nbdfuse: Option<Child>,
    loop_dev: Option<String>,
    mounted: bool,
}

impl Ext4Stack {
    /// Starts nbdfuse on `uri` and attaches a loop device to its file.
    fn attach(fuse_dir: &Path, mnt: &Path, uri: &str) -> Ext4Stack {
        std::fs::create_dir_all(fuse_dir).unwrap();
        std::fs::create_dir_all(mnt).unwrap();
        let log = std::fs::File::create(fuse_dir.with_extension("log")).unwrap();
        // nbdfuse stays in the foreground and serves until unmounted.
        let child = tool("nbdfuse")
            .arg(fuse_dir)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn nbdfuse");
        let mut s = Ext4Stack {
            fuse_dir: fuse_dir.to_owned(),
            mnt: mnt.to_owned(),
            nbdfuse: Some(child),
            loop_dev: None,
            mounted: false,
        };
        let file = fuse_dir.join("nbd");
        wait_until(
            "nbdfuse to expose FUSE_DIR/nbd",
            Duration::from_secs(30),
            || {
                if let Ok(Some(st)) = s.nbdfuse.as_mut().unwrap().try_wait() {
                    panic!("nbdfuse exited with {st}: {}", s.nbdfuse_log());
                }
                file.exists()
            },
        );
        let out = run(tool("losetup").args(["-f", "--show"]).arg(&file)).ok();
        let dev = out.stdout.trim().to_owned();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        s.loop_dev = Some(dev);
        s
    }

    fn dev(&self) -> &str {
        self.loop_dev.as_deref().expect("loop device attached")
    }

    fn nbdfuse_log(&self) -> String {
        std::fs::read_to_string(self.fuse_dir.with_extension("log")).unwrap_or_default()
    }

    fn mount(&mut self) {
        run(tool("mount")
            .args(["-t", "ext4", self.dev()])
            .arg(&self.mnt))
        .ok();
        self.mounted = true;
    }

    /// Unmounts, detaches and stops nbdfuse, failing on any error.
    fn teardown(mut self) {
        if self.mounted {
            run(tool("umount").arg(&self.mnt)).ok();
            self.mounted = false;
        }
        let dev = self.loop_dev.take().expect("loop device attached");
        run(tool("losetup").args(["-d", &dev])).ok();
        // The loop device may hold the file a moment longer after `losetup
        // -d` (a udev probe, say), making the unmount EBUSY: retry.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = run(tool("fusermount3").arg("-u").arg(&self.fuse_dir));
            if out.status.success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "cannot unmount nbdfuse: {out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut child = self.nbdfuse.take().unwrap();
        let status = wait_timeout(&mut child, Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "nbdfuse did not exit cleanly ({status:?}): {}",
            self.nbdfuse_log()
        );
    }
}

impl Drop for Ext4Stack {
    fn drop(&mut self) {
        let t = Duration::from_secs(20);
        if let Some(mut child) = self.nbdfuse.take() {
            let _ = child.kill();
            let _ = wait_timeout(&mut child, t);
        }
        if self.mounted {
            let _ = try_run(tool("umount").arg("-l").arg(&self.mnt), t);
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = try_run(tool("losetup").args(["-d", &dev]), t);
        }
        let _ = try_run(tool("fusermount3").arg("-uz").arg(&self.fuse_dir), t);
    }
}

/// `sha256sum` of the named files in `dir`, as printed (names relative).
fn sha256sums(dir: &Path, names: &[&str]) -> String {
    run(tool("sha256sum").current_dir(dir).args(names))
        .ok()
        .stdout
}

#[test]
fn ext4_through_nbdfuse_and_loop_survives_remount() {
    let tools = [
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
        "cp",
        "sync",
        "sha256sum",
    ];
    if !require(&tools) || !common::require_root_block_devices() {
        return;
    }
    let d = Daemon::start(&["ram0=64M"]);
    let uri = d.uri("ram0");
    let (fuse_dir, mnt, src) = (
        d.dir().join("fuse"),
        d.dir().join("mnt"),
        d.dir().join("src"),
    );
    let files: [(&str, usize); 6] = [
        ("empty", 0),
        ("one", 1),
        ("page-minus-one", 4095),
        ("small", 100_000),
        ("one-mib", MIB),
        ("big", 3 * MIB + 17),
    ];
    let names: Vec<&str> = files.iter().map(|f| f.0).collect();
    std::fs::create_dir(&src).unwrap();
    for (i, (name, len)) in files.iter().enumerate() {
        write_file(&src, name, &random_bytes(*len, 100 + i as u64));
    }
    let want = sha256sums(&src, &names);

    // Every access to the mounted filesystem happens in a child process with
    // a timeout, never in this thread: if ramd or nbdfuse hangs, the test
    // fails with a message instead of blocking in the kernel forever.
    let mut stack = Ext4Stack::attach(&fuse_dir, &mnt, &uri);
    run(tool("mkfs.ext4").args(["-q", "-F", stack.dev()])).ok();
    stack.mount();
    run(tool("cp")
        .args(["-t"])
        .arg(&mnt)
        .args(&names)
        .current_dir(&src))
    .ok();
    run(tool("sync").arg("-f").arg(&mnt)).ok();
    assert_eq!(
        sha256sums(&mnt, &names),
        want,
        "files differ right after writing"
    );
    stack.teardown();

    // A new nbdfuse process and loop device: every byte now comes from ramd.
    let mut stack = Ext4Stack::attach(&fuse_dir, &mnt, &uri);
    run(tool("e2fsck").args(["-f", "-n", stack.dev()])).ok();
    stack.mount();
    assert_eq!(
        sha256sums(&mnt, &names),
        want,
        "files changed across remount"
    );
    stack.teardown();
}

// --------------------------------------------------------- daemon process --

#[test]
fn sigterm_during_fio_exits_zero_and_removes_socket() {
    if !require(&["fio", "nbdinfo"]) {
        return;
    }
    let mut d = Daemon::start(&["ram0=256M"]);
    let uri = d.uri("ram0");
    // A load that would run for ten minutes: the daemon must not wait for
    // it (and fio's end within the minute below cannot be its runtime's).
    let mut fio = KillOnDrop(
        tool("fio")
            .current_dir(d.dir())
            .args([
                "--name=load",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=64k",
                "--iodepth=16",
                "--numjobs=2",
                "--size=128M",
                "--offset_increment=128M",
                "--time_based",
                "--runtime=600",
            ])
            .arg(format!("--uri={uri}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn fio"),
    );
    // Wait until fio's writes are landing, so requests are in flight.
    wait_until("fio to write to the drive", WAIT_TIMEOUT, || {
        assert!(fio.0.try_wait().unwrap().is_none(), "fio exited early");
        nbdinfo_map(&uri).iter().any(|e| e.desc == "data")
    });

    let socket = d.socket().to_owned();
    let status = d.terminate();
    // fio loses its server; it only has to notice and stop.
    let fio_status = wait_timeout(&mut fio.0, WAIT_TIMEOUT);
    assert!(status.success(), "ramd exited with {status}:\n{}", d.log());
    assert!(!socket.exists(), "the socket file was left behind");
    assert!(
        fio_status.is_some(),
        "fio kept running after the daemon exited"
    );
}

#[test]
fn second_daemon_on_the_same_socket_is_refused() {
    if !require(&["nbdinfo"]) {
        return;
    }
    let mut d = Daemon::start(&["ram0=1M"]);
    // Its own API socket, the first one's NBD socket: the NBD bind refuses.
    let out = run(ramd()
        .args(["serve", "--no-config", "--drive", "x=1M", "--socket"])
        .arg(d.socket())
        .arg("--api-socket")
        .arg(d.dir().join("other-api.sock")))
    .failed();
    assert!(out.stderr.contains("in use"), "{out}");
    assert!(out.stderr.contains(&format!("pid {}", d.pid())), "{out}");
    // The first daemon is unharmed.
    assert!(d.is_running());
    assert!(d.socket().exists());
    let size = run(tool("nbdinfo").args(["--size", &d.uri("ram0")])).ok();
    assert_eq!(size.stdout.trim(), "1048576");
}

#[test]
fn bad_command_lines_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    for (drive, expect) in [
        ("x=12Q", &["x=12Q", "unknown size unit"][..]),
        ("BAD=1G", &["BAD=1G", "invalid drive name 'BAD'"]),
        ("x", &["expected NAME=SIZE"]),
        ("x=0", &["at least 4 KiB (one page)"]),
        ("x=1G,turbo", &["unknown option 'turbo'"]),
    ] {
        let out = run(ramd()
            .args(["serve", "--no-config", "--drive", drive, "--socket"])
            .arg(&socket))
        .failed();
        assert_eq!(out.code(), 1, "{out}");
        for e in expect {
            assert!(out.stderr.contains(e), "want {e:?} in: {out}");
        }
        assert!(!socket.exists(), "{drive}: a socket was created anyway");
    }
    // Two drives with one name.
    let out = run(ramd()
        .args([
            "serve",
            "--no-config",
            "--drive",
            "a=1M",
            "--drive",
            "a=2M",
            "--socket",
        ])
        .arg(&socket))
    .failed();
    assert!(out.stderr.contains("given twice"), "{out}");
}

/// A client connected before a shrink keeps the size it was told (NBD has
/// no size-change notice); its requests past the new end fail with EINVAL
/// (reads) and ENOSPC (writes), and the rest of the drive keeps working.
#[test]
fn nbdsh_client_connected_before_a_shrink_gets_errors_past_the_new_end() {
    if !require(&["nbdsh"]) {
        return;
    }
    let d = Daemon::start(&["shrink=8M"]);
    let socket = d.api_socket().to_owned();
    let script = format!(
        r#"
        import subprocess
        h.pwrite(b"k" * 4096, 0)
        h.pwrite(b"z" * 4096, 6 << 20)
        out = subprocess.run([{ramd:?}, "--api-socket", {socket:?}, "resize", "shrink", "4M", "--force"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out
        assert "reconnect" in out.stdout, out.stdout
        assert "1 NBD connection(s) to 'shrink' keep the size" in out.stderr, out.stderr
        assert h.get_size() == 8 << 20, "the old size until a reconnect"
        h.set_strict_mode(0)
        expect_err(errno.EINVAL, "pread past the new end", lambda: h.pread(4096, 6 << 20))
        expect_err(errno.ENOSPC, "pwrite past the new end", lambda: h.pwrite(b"w" * 4096, 6 << 20))
        assert h.pread(4096, 0) == b"k" * 4096
        h.pwrite(b"m" * 4096, 4096)
        "#,
        ramd = env!("CARGO_BIN_EXE_ramd"),
        socket = socket.to_str().unwrap(),
    );
    nbdsh(&d.uri("shrink"), &script);
    nbdsh(&d.uri("shrink"), "assert h.get_size() == 4 << 20");
}
