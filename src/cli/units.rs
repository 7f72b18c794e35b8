//! `ramd install-units`: the systemd units of contrib/systemd (embedded in
//! the binary) put in place, with this binary's path in `ExecStart=` and an
//! ordering drop-in naming the mount unit of every directory kept in RAM.
//!
//! Files written (under `--dir`, default `/etc/systemd/system`):
//!
//! ```text
//! ramd.service                 the daemon (Type=notify)
//! ramd-sleep.service           `ramd dir sync --all` before suspend
//! ramd.service.d/dirs.conf     After=<escaped path>.mount per directory
//! ```
//!
//! The units name a binary by its path, so that path must outlive the
//! build: a binary inside a cargo build tree (`target/release/ramd`) is
//! replaced by the next `cargo build` and gone after `cargo clean`, and
//! the service would then run another version, or nothing, at the next
//! boot. Writing units for such a binary is refused unless `--bin` names
//! it on purpose (then, and for `--dry-run`, a warning says why).

use std::path::{Path, PathBuf};

use super::{daemon, CliError};
use crate::api::client::{Client, ClientError};

const SERVICE: &str = include_str!("../../contrib/systemd/ramd.service");
const SLEEP_SERVICE: &str = include_str!("../../contrib/systemd/ramd-sleep.service");
/// The binary path the embedded units name.
const UNIT_BINARY: &str = "/usr/local/sbin/ramd";
/// Where systemd reads administrator units.
pub const DEFAULT_UNIT_DIR: &str = "/etc/systemd/system";

/// `ramd install-units` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct InstallArgs {
    /// Where to write the units.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_UNIT_DIR)]
    pub dir: PathBuf,
    /// Print what would be written; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The ramd binary the units run [default: this binary, unless it is
    /// in a cargo build tree: install it first, e.g. to
    /// /usr/local/sbin/ramd].
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
    /// Also order after the directories of this config file's [[dir]]s
    /// [default: /etc/ramd/ramd.toml when it exists].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Units would run this binary, which lives in a cargo build tree.
#[derive(Debug, thiserror::Error)]
#[error("this ramd is {}, in the cargo build tree {}: units that run it break at the next `cargo build` or `cargo clean`. Install it and run the installed one: `install -m 0755 {} /usr/local/sbin/ramd && /usr/local/sbin/ramd install-units`; or pass --bin {} to use the build tree anyway", bin.display(), tree.display(), bin.display(), bin.display())]
pub struct InBuildTree {
    pub bin: PathBuf,
    pub tree: PathBuf,
}

/// The cargo target directory `bin` lives in, if any: an ancestor that
/// holds cargo's `CACHEDIR.TAG`, or a `target` next to a `Cargo.toml`.
pub fn build_tree(bin: &Path) -> Option<PathBuf> {
    let is_target = |d: &Path| {
        let tagged =
            std::fs::read_to_string(d.join("CACHEDIR.TAG")).is_ok_and(|t| t.contains("cargo"));
        let named = d.file_name().is_some_and(|n| n == "target")
            && d.parent().is_some_and(|p| p.join("Cargo.toml").is_file());
        tagged || named
    };
    bin.ancestors()
        .skip(1)
        .find(|d| is_target(d))
        .map(Path::to_path_buf)
}

/// The binary the units run: `--bin`, else this one, refused when it is
/// in a build tree (a warning instead with `--bin` or `--dry-run`).
fn unit_binary(args: &InstallArgs) -> Result<PathBuf, CliError> {
    let bin = match &args.bin {
        Some(b) => std::path::absolute(b).unwrap_or_else(|_| b.clone()),
        None => std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(CliError::NoBinaryPath)?,
    };
    if let Some(tree) = build_tree(&bin) {
        if args.bin.is_none() && !args.dry_run {
            return Err(InBuildTree { bin, tree }.into());
        }
        eprintln!(
            "warning: the units run {}, in the cargo build tree {}: they break at the next `cargo build` or `cargo clean` (install the binary, e.g. to /usr/local/sbin/ramd, and pass that with --bin)",
            bin.display(),
            tree.display()
        );
    }
    Ok(bin)
}

/// A path as a systemd unit name (what `systemd-escape --path` prints):
/// slashes become `-`, other bytes outside `[A-Za-z0-9:_.]` (and a leading
/// `.`) become `\xNN`; `/` alone is `-`.
pub fn escape_path(path: &Path) -> String {
    let text = path.as_os_str().as_encoded_bytes();
    let parts: Vec<&[u8]> = text
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect();
    if parts.is_empty() {
        return "-".into();
    }
    let joined = parts.join(&b'/');
    let mut out = String::with_capacity(joined.len());
    for (i, &b) in joined.iter().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || b == b':' || b == b'_' || b == b'.' => {
                out.push(b as char)
            }
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// The drop-in ordering ramd's stop before each directory's unmount.
pub fn drop_in(dirs: &[PathBuf]) -> String {
    let mut s = String::from(
        "# Written by `ramd install-units`. Stop order is the reverse of start order:\n\
         # with After= on the mount unit of each directory kept in RAM, ramd stops\n\
         # (final sync, unmount) before systemd would unmount the RAM copy.\n\
         # Run `ramd install-units` again after `ramd dir add` / `ramd dir remove`.\n\
         [Unit]\n",
    );
    for d in dirs {
        s.push_str(&format!("After={}.mount\n", escape_path(d)));
    }
    s
}

/// The files to write: (relative path, content).
pub fn units(bin: &Path, dirs: &[PathBuf]) -> Vec<(PathBuf, String)> {
    let bin = bin.display().to_string();
    vec![
        (
            PathBuf::from("ramd.service"),
            SERVICE.replace(UNIT_BINARY, &bin),
        ),
        (
            PathBuf::from("ramd-sleep.service"),
            SLEEP_SERVICE.replace(UNIT_BINARY, &bin),
        ),
        (PathBuf::from("ramd.service.d/dirs.conf"), drop_in(dirs)),
    ]
}

/// Directories to order after: the running daemon's, plus the config's.
fn managed_dirs(client: &Client, config: Option<&Path>) -> Result<Vec<PathBuf>, CliError> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    match client.list_dirs() {
        Ok(list) => dirs.extend(list.dirs.into_iter().map(|d| d.path)),
        Err(ClientError::NotRunning { .. }) => {
            eprintln!("note: the daemon is not running; ordering only after the config's [[dir]]s")
        }
        Err(e) => return Err(e.into()),
    }
    let default = Path::new(daemon::DEFAULT_CONFIG_PATH);
    let config = config.or(default.exists().then_some(default));
    if let Some(file) = config {
        dirs.extend(daemon::config_dirs(file)?);
    }
    dirs.sort();
    dirs.dedup();
    Ok(dirs)
}

/// Writes `text` to `path` through a temporary file and a rename.
fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("ramd-tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Runs `ramd install-units`.
pub fn run(client: &Client, args: InstallArgs) -> Result<(), CliError> {
    let bin = unit_binary(&args)?;
    let dirs = managed_dirs(client, args.config.as_deref())?;
    let files = units(&bin, &dirs);
    for (rel, text) in &files {
        let path = args.dir.join(rel);
        if args.dry_run {
            println!("# would write {}\n{text}", path.display());
            continue;
        }
        write_file(&path, text).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        })?;
        println!("wrote {}", path.display());
    }
    if !bin.exists() {
        eprintln!("warning: the units run {}, which does not exist; install the binary there or pass --bin", bin.display());
    }
    let next = "systemctl daemon-reload && systemctl enable --now ramd.service ramd-sleep.service";
    if args.dry_run {
        println!("# nothing written (--dry-run); then: {next}");
    } else if args.dir == Path::new(DEFAULT_UNIT_DIR) {
        println!("next: {next}");
    } else {
        println!(
            "next: copy them into {DEFAULT_UNIT_DIR} (or point systemd at {}), then: {next}",
            args.dir.display()
        );
    }
    if dirs.is_empty() {
        println!("no directories in RAM yet: run `ramd install-units` again after `ramd dir add`");
    } else {
        println!(
            "ordered after the unmount of: {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_systemd_escape_path() {
        // Values printed by `systemd-escape --path`.
        for (path, want) in [
            ("/", "-"),
            ("/var/log", "var-log"),
            ("/var/log/", "var-log"),
            ("//var//log", "var-log"),
            ("/home/alice/.cache", "home-alice-.cache"),
            ("/.hidden/x", "\\x2ehidden-x"),
            ("/a b/-x/ü", "a\\x20b-\\x2dx-\\xc3\\xbc"),
            ("/srv/build:1/a_b", "srv-build:1-a_b"),
        ] {
            assert_eq!(escape_path(Path::new(path)), want, "{path}");
        }
    }

    #[test]
    fn binaries_in_a_cargo_build_tree_are_found() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        std::fs::create_dir_all(repo.join("target/release")).unwrap();
        std::fs::write(repo.join("Cargo.toml"), "[package]\n").unwrap();
        let bin = repo.join("target/release/ramd");
        assert_eq!(build_tree(&bin), Some(repo.join("target")));
        // A target directory elsewhere (CARGO_TARGET_DIR) has cargo's tag.
        let other = root.path().join("build-out");
        std::fs::create_dir_all(other.join("debug")).unwrap();
        std::fs::write(other.join("CACHEDIR.TAG"), "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by cargo.\n").unwrap();
        assert_eq!(build_tree(&other.join("debug/ramd")), Some(other.clone()));
        // An installed binary, or a `target` directory of something else.
        assert_eq!(build_tree(Path::new("/usr/local/sbin/ramd")), None);
        std::fs::create_dir_all(root.path().join("x/target")).unwrap();
        assert_eq!(build_tree(&root.path().join("x/target/ramd")), None);
    }

    #[test]
    fn units_name_the_binary_and_the_mounts() {
        let files = units(
            Path::new("/opt/ramd/bin/ramd"),
            &[PathBuf::from("/var/log"), PathBuf::from("/home/u/.cache")],
        );
        assert_eq!(files.len(), 3);
        let service = &files[0].1;
        assert!(
            service.contains("ExecStart=/opt/ramd/bin/ramd daemon"),
            "{service}"
        );
        assert!(!service.contains(UNIT_BINARY));
        assert!(service.contains("Type=notify"));
        assert!(files[1]
            .1
            .contains("ExecStart=/opt/ramd/bin/ramd dir sync --all"));
        assert!(files[2]
            .1
            .contains("After=var-log.mount\nAfter=home-u-.cache.mount\n"));
    }
}
