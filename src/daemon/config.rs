//! The declarative config file (TOML), parsed strictly.
//!
//! Every key is documented in docs/config.md. Unknown keys, wrong types,
//! bad sizes, bad names and duplicate drives are errors that name the file,
//! the line and the column (`FILE:LINE:COL: reason`), so the daemon refuses
//! to start on a config it would misread.
//!
//! ```toml
//! [daemon]
//! api_socket = "/run/ramd/api.sock"
//! nbd_socket = "/run/ramd/nbd.sock"
//! state_dir = "/var/lib/ramd"
//! nbd_listen = ["127.0.0.1:10809"]
//! mem_budget = "16G"
//! max_connections = 256
//! poll_us = 50
//! metrics = true
//! log = "info"
//! log_format = "text"
//!
//! [[drive]]
//! name = "ram0"
//! size = "1G"
//! mem_limit = "512M"
//! read_only = false
//! overcommit = false
//!
//! [[dir]]
//! path = "/var/log"
//! interval = "10m"
//! overlay = false
//! size_limit = "2G"
//! recovery_generations = 3
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::dirs::DirSpec;
use super::spec::{check_name, parse_drive_size, DriveSpec};
use crate::size::parse_size;

/// The default config file, read when present and no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ramd/ramd.toml";

/// Why a config file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid (syntax, unknown key, bad value).
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

/// A size written as `"4G"` or as a number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size like \"4G\", \"512M\", \"1.5GiB\" or a number of bytes")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for journald/log shippers).
    Json,
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Daemon settings.
    #[serde(default)]
    pub daemon: DaemonSection,
    /// Drives created at start.
    #[serde(default, rename = "drive")]
    pub drives: Vec<DriveEntry>,
    /// Directories kept in RAM (added or restored at start).
    #[serde(default, rename = "dir")]
    pub dirs: Vec<DirEntry>,
}

/// `[daemon]`: each key matches a `ramd daemon` flag, which wins over it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    pub api_socket: Option<PathBuf>,
    pub nbd_socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub nbd_listen: Option<Vec<SocketAddr>>,
    pub mem_budget: Option<Size>,
    pub max_connections: Option<usize>,
    pub poll_us: Option<u32>,
    pub metrics: Option<bool>,
    pub log: Option<String>,
    pub log_format: Option<LogFormat>,
}

/// `[[drive]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveEntry {
    pub name: Spanned<String>,
    pub size: Spanned<Size>,
    pub mem_limit: Option<Size>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub overcommit: bool,
}

/// `[[dir]]`: see [`super::dirs::DirSpec`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirEntry {
    pub path: Spanned<PathBuf>,
    pub interval: Option<Spanned<String>>,
    #[serde(default)]
    pub overlay: bool,
    pub size_limit: Option<Spanned<Size>>,
    pub recovery_generations: Option<Spanned<u32>>,
}

/// A parsed and checked config.
#[derive(Debug, Default)]
pub struct Config {
    /// The file it came from (None: built-in defaults).
    pub path: Option<PathBuf>,
    pub daemon: DaemonSection,
    pub drives: Vec<DriveSpec>,
    /// Directories to keep in RAM, each with where it is declared.
    pub dirs: Vec<DirSpec>,
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// Parses config text; `path` is used in messages.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let invalid = |offset: usize, message: String| {
        let (line, column) = line_col(text, offset);
        ConfigError::Invalid {
            path: path.to_owned(),
            line,
            column,
            message,
        }
    };
    let file: ConfigFile = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        invalid(offset, e.message().trim().to_owned())
    })?;
    let mut drives: Vec<DriveSpec> = Vec::new();
    for d in &file.drives {
        let name = d.name.get_ref();
        check_name(name).map_err(|e| invalid(d.name.span().start, e.to_string()))?;
        if drives.iter().any(|x| &x.name == name) {
            return Err(invalid(
                d.name.span().start,
                format!("drive '{name}' is declared twice"),
            ));
        }
        let size = d.size.get_ref().0;
        parse_drive_size(&size.to_string())
            .map_err(|e| invalid(d.size.span().start, e.to_string()))?;
        drives.push(DriveSpec {
            name: name.clone(),
            size_bytes: size,
            mem_limit_bytes: d.mem_limit.map(|s| s.0),
            read_only: d.read_only,
            overcommit: d.overcommit,
        });
    }
    let mut dirs: Vec<DirSpec> = Vec::new();
    for d in &file.dirs {
        let at = |offset: usize| {
            let (line, column) = line_col(text, offset);
            (path.to_owned(), line, column)
        };
        let spec = DirSpec::from_entry(d, at(d.path.span().start))
            .map_err(|(offset, message)| invalid(offset, message))?;
        if let Some(other) = dirs
            .iter()
            .find(|o| o.path.starts_with(&spec.path) || spec.path.starts_with(&o.path))
        {
            let message = if other.path == spec.path {
                format!("directory {} is declared twice", spec.path.display())
            } else {
                format!(
                    "directory {} overlaps {} (line {}): one directory cannot be kept in RAM inside another",
                    spec.path.display(),
                    other.path.display(),
                    other.at.1
                )
            };
            return Err(invalid(d.path.span().start, message));
        }
        dirs.push(spec);
    }
    Ok(Config {
        path: Some(path.to_owned()),
        daemon: file.daemon,
        drives,
        dirs,
    })
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("ramd.toml"), text).unwrap_err().to_string()
    }

    #[test]
    fn full_config() {
        let c = parse(
            Path::new("x.toml"),
            r#"
[daemon]
nbd_listen = ["127.0.0.1:10809"]
mem_budget = "2G"
max_connections = 8
metrics = false
log_format = "json"

[[drive]]
name = "a"
size = "1G"
mem_limit = 1048576

[[drive]]
name = "b"
size = 4096
read_only = true
"#,
        )
        .unwrap();
        assert_eq!(c.daemon.mem_budget, Some(Size(2 << 30)));
        assert_eq!(c.daemon.log_format, Some(LogFormat::Json));
        assert_eq!(c.drives.len(), 2);
        assert_eq!(c.drives[0].mem_limit_bytes, Some(1 << 20));
        assert!(c.drives[1].read_only);
    }

    #[test]
    fn dirs() {
        let c = parse(
            Path::new("x.toml"),
            "[[dir]]\npath = \"/var/log/\"\ninterval = \"5m\"\nsize_limit = \"1G\"\n\n[[dir]]\npath = \"/home/u/.cache\"\noverlay = true\nrecovery_generations = 1\n",
        )
        .unwrap();
        assert_eq!(c.dirs.len(), 2);
        assert_eq!(c.dirs[0].path, Path::new("/var/log"));
        assert_eq!(c.dirs[0].sync_interval_ms, 300_000);
        assert_eq!(c.dirs[0].size_limit_bytes, Some(1 << 30));
        assert_eq!(c.dirs[0].at.1, 2);
        assert_eq!(c.dirs[1].mode, crate::dirsync::mounts::MountMode::Overlay);
        assert_eq!(c.dirs[1].recovery_generations, 1);
        assert_eq!(
            c.dirs[1].sync_interval_ms,
            crate::dirsync::manager::DEFAULT_SYNC_INTERVAL_MS
        );
        for (text, want) in [
            (
                "[[dir]]\npath = \"var/log\"\n",
                "ramd.toml:2:8: the directory must be an absolute path",
            ),
            ("[[dir]]\npath = \"/a/../b\"\n", "ramd.toml:2:8: "),
            (
                "[[dir]]\npath = \"/a\"\ninterval = \"soon\"\n",
                "ramd.toml:3:12: invalid interval",
            ),
            (
                "[[dir]]\npath = \"/a\"\ninterval = \"10ms\"\n",
                "ramd.toml:3:12: ",
            ),
            (
                "[[dir]]\npath = \"/a\"\nsize_limit = \"12Q\"\n",
                "ramd.toml:3:14: unknown size unit",
            ),
            (
                "[[dir]]\npath = \"/a\"\nsize_limit = 0\n",
                "ramd.toml:3:14: ",
            ),
            (
                "[[dir]]\npath = \"/a\"\nrecovery_generations = 0\n",
                "ramd.toml:3:24: ",
            ),
            (
                "[[dir]]\npath = \"/a\"\nintervall = \"1m\"\n",
                "ramd.toml:3:1: unknown field `intervall`",
            ),
            (
                "[[dir]]\npath = \"/a\"\n[[dir]]\npath = \"/a\"\n",
                "ramd.toml:4:8: directory /a is declared twice",
            ),
            (
                "[[dir]]\npath = \"/a\"\n[[dir]]\npath = \"/a/b\"\n",
                "ramd.toml:4:8: directory /a/b overlaps /a (line 2)",
            ),
            ("[[dir]]\ninterval = \"1m\"\n", "missing field `path`"),
        ] {
            let e = err(text);
            assert!(e.contains(want), "want {want:?} in {e:?} for {text:?}");
        }
    }

    #[test]
    fn errors_name_file_line_and_reason() {
        let e = err("[daemon]\nmax_connections = 3\nturbo = true\n");
        assert!(e.starts_with("ramd.toml:3:1: "), "{e}");
        assert!(e.contains("unknown field `turbo`"), "{e}");
        let e = err("[[drive]]\nname = \"a\"\nsize = \"12Q\"\n");
        assert!(e.starts_with("ramd.toml:3:8: "), "{e}");
        assert!(e.contains("unknown size unit"), "{e}");
        let e = err("[[drive]]\nname = \"A\"\nsize = \"1G\"\n");
        assert!(e.starts_with("ramd.toml:2:8: invalid drive name"), "{e}");
        let e = err("[[drive]]\nname = \"a\"\nsize = \"1G\"\n[[drive]]\nname = \"a\"\nsize = 1\n");
        assert!(
            e.starts_with("ramd.toml:5:8: drive 'a' is declared twice"),
            "{e}"
        );
        let e = err("[[drive]]\nname = \"a\"\nsize = 0\n");
        assert!(e.starts_with("ramd.toml:3:8: "), "{e}");
        let e = err("[daemon\n");
        assert!(e.starts_with("ramd.toml:1:"), "{e}");
        let e = err("[[drive]]\nname = \"a\"\n");
        assert!(e.contains("missing field `size`"), "{e}");
        let e = err("[daemon]\nnbd_listen = [\"nowhere\"]\n");
        assert!(e.starts_with("ramd.toml:2:"), "{e}");
    }
}
