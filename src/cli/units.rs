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
    /// The ramd binary the units run [default: this binary].
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
    /// Also order after the directories of this config file's [[dir]]s
    /// [default: /etc/ramd/ramd.toml when it exists].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
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
    let bin = match args.bin {
        Some(b) => std::path::absolute(&b).unwrap_or(b),
        None => std::env::current_exe()
            .and_then(std::fs::canonicalize)
            .map_err(CliError::NoBinaryPath)?,
    };
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
