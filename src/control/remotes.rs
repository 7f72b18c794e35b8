//! Remotes: named places in S3-compatible object storage where drive
//! snapshots go (`snapshot::Remote` does the talking; this file keeps the
//! names, where each came from, and how to reach it).
//!
//! A remote is declared in the config (`[[remote]]`) or added through the
//! API (`ramd remote add`). Those added through the API are kept in
//! `STATE_DIR/remotes.json` (mode 0600, written whole and renamed into
//! place) so they come back at the next start; those of the config are
//! never written there and cannot be removed through the API.
//!
//! # Credentials
//!
//! Never stored here in the clear for API remotes: the API takes only a
//! *path* to a credentials file (TOML, mode 0600 checked on every use, see
//! `snapshot::remote`). A config remote may also give the key pair inline
//! (the config file should then be private). Without either, the daemon's
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`)
//! is used. Credentials are resolved at each use, so a rotated file takes
//! effect at the next push. The secret never reaches a `Debug` output, a
//! log line, an error or the API: [`RemoteSpec`] shows only where its
//! credentials come from ([`RemoteSpec::credentials_source`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::snapshot::remote::{BadRemoteUrl, CredentialsError};
use crate::snapshot::{Credentials, Keys, Remote, RemoteConfig, RemoteError, RemoteUrl};

/// The file API remotes are kept in, under the state directory.
pub const REMOTES_FILE: &str = "remotes.json";

/// Who declared a remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteOrigin {
    /// The config file's `[[remote]]`.
    Config,
    /// `ramd remote add` (kept in the state directory).
    Api,
}

impl RemoteOrigin {
    pub fn name(self) -> &'static str {
        match self {
            RemoteOrigin::Config => "config",
            RemoteOrigin::Api => "api",
        }
    }
}

/// One remote, checked.
#[derive(Clone)]
pub struct RemoteSpec {
    pub name: String,
    pub url: RemoteUrl,
    /// `http(s)://host:port` of an S3-compatible server; None for AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// A TOML credentials file (0600).
    pub credentials_file: Option<PathBuf>,
    /// The snapshot key (32 bytes or 64 hex digits, 0600) for `--encrypt`
    /// pushes and for restoring encrypted snapshots.
    pub encrypt_key_file: Option<PathBuf>,
    /// The chunk size of pushes to it as given (None: the default, see
    /// [`RemoteSpec::chunk_bytes`]).
    pub chunk_size: Option<u64>,
    pub origin: RemoteOrigin,
    /// Inline credentials from the config (never from the API).
    inline: Option<Credentials>,
}

impl std::fmt::Debug for RemoteSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSpec")
            .field("name", &self.name)
            .field("url", &self.url.to_string())
            .field("endpoint", &self.endpoint)
            .field("credentials", &self.credentials_source())
            .finish_non_exhaustive()
    }
}

/// Why a remote was refused or could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RemotesError {
    /// The name breaks the rule.
    #[error("invalid remote name '{0}': use 1-64 of a-z 0-9 _ -, starting with a letter or digit")]
    Name(String),
    /// Not `s3://BUCKET[/PREFIX]`.
    #[error(transparent)]
    Url(#[from] BadRemoteUrl),
    /// Not `http(s)://...`.
    #[error("endpoint '{0}' is not an http:// or https:// URL")]
    Endpoint(String),
    /// A relative file path (the daemon's working directory is not the
    /// caller's).
    #[error("{what} must be an absolute path, not '{}'", path.display())]
    RelativePath { what: &'static str, path: PathBuf },
    /// The name is taken.
    #[error("remote '{0}' already exists (see `ramd remote list`)")]
    Exists(String),
    /// No such remote.
    #[error("no remote '{0}' (see `ramd remote list`; add one with `ramd remote add`)")]
    NotFound(String),
    /// A config remote cannot be removed at run time.
    #[error("remote '{0}' is declared in the config file: remove it there and restart the daemon")]
    FromConfig(String),
    /// The state file could not be written.
    #[error("cannot save the remotes to {}: {source}", path.display())]
    Save {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The state file could not be read.
    #[error("cannot read the remotes from {}: {reason} (fix or remove the file)", path.display())]
    Load { path: PathBuf, reason: String },
    /// Credentials could not be found or read.
    #[error("remote '{remote}': {source}")]
    Credentials {
        remote: String,
        source: CredentialsError,
    },
    /// The client could not be built.
    #[error("remote '{remote}': {source}")]
    Open { remote: String, source: RemoteError },
    /// Encryption asked for, but the remote has no key.
    #[error("remote '{0}' has no encrypt_key_file: add one to encrypt its snapshots")]
    NoKey(String),
    /// The drive is encrypted at rest and the remote has no key: its data
    /// would leave the host in plaintext.
    #[error("drive '{drive}' is encrypted at rest, so its snapshots are encrypted too, but remote '{remote}' has no encrypt_key_file: add the remote again with --encrypt-key-file FILE (ramd remote remove {remote}; ramd remote add {remote} ... --encrypt-key-file FILE)")]
    EncryptedDrive { drive: String, remote: String },
    /// Not a chunk size the format takes.
    #[error("chunk_size '{text}': {reason}")]
    ChunkSize { text: String, reason: String },
    /// The key file could not be loaded.
    #[error("remote '{remote}': {source}")]
    Key {
        remote: String,
        source: crate::snapshot::codec::KeyError,
    },
}

/// `[[remote]]` in the config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteEntry {
    pub name: Spanned<String>,
    /// `s3://BUCKET/PREFIX`.
    pub url: Spanned<String>,
    pub endpoint: Option<Spanned<String>>,
    pub region: Option<String>,
    pub credentials_file: Option<Spanned<PathBuf>>,
    pub encrypt_key_file: Option<Spanned<PathBuf>>,
    /// Inline credentials (keep the config file private then).
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Spanned<String>>,
    /// The chunk size of pushes: `"256K"`, `"1M"` (a power of two, 64 KiB
    /// to 64 MiB).
    pub chunk_size: Option<Spanned<String>>,
}

/// What `ramd remote add` sends (and `remotes.json` keeps): no secrets.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoredRemote {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    #[serde(default)]
    pub encrypt_key_file: Option<PathBuf>,
    /// The chunk size of pushes in bytes (None: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_bytes: Option<u64>,
}

/// Parses a chunk size (`256K`, `1M`, bytes) and checks it.
pub fn parse_chunk_size(text: &str) -> Result<u64, RemotesError> {
    let bad = |reason: String| RemotesError::ChunkSize {
        text: text.to_owned(),
        reason,
    };
    let bytes = crate::size::parse(text).map_err(|e| bad(e.to_string()))?;
    crate::snapshot::chunk::check_chunk_bytes(bytes).map_err(|e| bad(e.to_string()))
}

/// The name rule (the drives' rule: one kind of name for the user).
pub fn check_remote_name(name: &str) -> Result<(), RemotesError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-');
    if ok {
        Ok(())
    } else {
        Err(RemotesError::Name(name.to_owned()))
    }
}

fn check_endpoint(e: &str) -> Result<(), RemotesError> {
    if e.starts_with("http://") || e.starts_with("https://") {
        Ok(())
    } else {
        Err(RemotesError::Endpoint(e.to_owned()))
    }
}

fn check_absolute(what: &'static str, p: &Option<PathBuf>) -> Result<(), RemotesError> {
    match p {
        Some(path) if !path.is_absolute() => Err(RemotesError::RelativePath {
            what,
            path: path.clone(),
        }),
        _ => Ok(()),
    }
}

impl StoredRemote {
    /// Checks it and makes it a spec of `origin`.
    pub fn to_spec(&self, origin: RemoteOrigin) -> Result<RemoteSpec, RemotesError> {
        check_remote_name(&self.name)?;
        let url: RemoteUrl = self.url.parse()?;
        if let Some(e) = &self.endpoint {
            check_endpoint(e)?;
        }
        check_absolute("credentials_file", &self.credentials_file)?;
        check_absolute("encrypt_key_file", &self.encrypt_key_file)?;
        let chunk_size = self
            .chunk_bytes
            .map(|n| parse_chunk_size(&n.to_string()))
            .transpose()?;
        Ok(RemoteSpec {
            name: self.name.clone(),
            url,
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            credentials_file: self.credentials_file.clone(),
            encrypt_key_file: self.encrypt_key_file.clone(),
            chunk_size,
            origin,
            inline: None,
        })
    }
}

impl RemoteEntry {
    /// The spec, or (byte offset of the bad key, message).
    pub fn to_spec(&self) -> Result<RemoteSpec, (usize, String)> {
        let chunk_bytes = match &self.chunk_size {
            Some(c) => {
                Some(parse_chunk_size(c.get_ref()).map_err(|e| (c.span().start, e.to_string()))?)
            }
            None => None,
        };
        let stored = StoredRemote {
            name: self.name.get_ref().clone(),
            url: self.url.get_ref().clone(),
            endpoint: self.endpoint.as_ref().map(|e| e.get_ref().clone()),
            region: self.region.clone(),
            credentials_file: self.credentials_file.as_ref().map(|p| p.get_ref().clone()),
            encrypt_key_file: self.encrypt_key_file.as_ref().map(|p| p.get_ref().clone()),
            chunk_bytes,
        };
        let at = |e: RemotesError| {
            let offset = match &e {
                RemotesError::Url(_) => self.url.span().start,
                RemotesError::Endpoint(_) => self.endpoint.as_ref().map_or(0, |v| v.span().start),
                RemotesError::RelativePath { what, .. } if *what == "credentials_file" => {
                    self.credentials_file.as_ref().map_or(0, |v| v.span().start)
                }
                RemotesError::RelativePath { .. } => {
                    self.encrypt_key_file.as_ref().map_or(0, |v| v.span().start)
                }
                _ => self.name.span().start,
            };
            (offset, e.to_string())
        };
        let mut spec = stored.to_spec(RemoteOrigin::Config).map_err(at)?;
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(id), Some(secret)) => {
                spec.inline = Some(Credentials {
                    access_key_id: id.clone(),
                    secret_access_key: secret.get_ref().clone(),
                    region: None,
                });
            }
            (None, None) => {}
            _ => {
                return Err((
                    self.name.span().start,
                    format!(
                        "remote '{}': give both access_key_id and secret_access_key, or neither",
                        self.name.get_ref()
                    ),
                ))
            }
        }
        Ok(spec)
    }
}

impl RemoteSpec {
    /// Whether the config file holds its secret (then the file must be
    /// private: `config::load`).
    pub fn has_inline_secret(&self) -> bool {
        self.inline.is_some()
    }

    /// Where its credentials come from, for listings (never the secret).
    pub fn credentials_source(&self) -> String {
        if let Some(f) = &self.credentials_file {
            format!("file {}", f.display())
        } else if self.inline.is_some() {
            "config".to_owned()
        } else if Credentials::from_env().is_some() {
            "environment".to_owned()
        } else {
            "missing".to_owned()
        }
    }

    /// What `remotes.json` keeps of it.
    pub fn stored(&self) -> StoredRemote {
        StoredRemote {
            name: self.name.clone(),
            url: self.url.to_string(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            credentials_file: self.credentials_file.clone(),
            encrypt_key_file: self.encrypt_key_file.clone(),
            chunk_bytes: self.chunk_size,
        }
    }

    /// The chunk size of pushes to it (`snapshot::chunk`; a restore reads
    /// any). Drives pushed with the same size share their chunks.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_size
            .unwrap_or(crate::snapshot::DEFAULT_CHUNK_BYTES)
    }

    /// A client for it, with its credentials resolved now.
    pub fn open(&self) -> Result<Remote, RemotesError> {
        let creds = Credentials::resolve(self.credentials_file.as_deref(), self.inline.clone())
            .map_err(|source| RemotesError::Credentials {
                remote: self.name.clone(),
                source,
            })?;
        let mut config = RemoteConfig::new(self.url.clone());
        config.endpoint = self.endpoint.clone();
        config.region = self.region.clone();
        Remote::open(&config, &creds).map_err(|source| RemotesError::Open {
            remote: self.name.clone(),
            source,
        })
    }

    /// The snapshot key: Some when the remote has a key file.
    pub fn keys(&self) -> Result<Option<Arc<Keys>>, RemotesError> {
        let Some(path) = &self.encrypt_key_file else {
            return Ok(None);
        };
        Keys::load(path)
            .map(|k| Some(Arc::new(k)))
            .map_err(|source| RemotesError::Key {
                remote: self.name.clone(),
                source,
            })
    }
}

/// Every remote the daemon knows.
pub struct Remotes {
    /// By name. A plain mutex: held for map work only.
    map: Mutex<BTreeMap<String, RemoteSpec>>,
    /// `STATE_DIR/remotes.json` (None: API remotes are not kept).
    file: Option<PathBuf>,
}

impl Remotes {
    /// The config's remotes plus those kept in `state_dir` (a kept one
    /// whose name the config now uses is dropped, with a warning).
    pub fn load(
        config: Vec<RemoteSpec>,
        state_dir: Option<&Path>,
    ) -> Result<Remotes, RemotesError> {
        let file = state_dir.map(|d| d.join(REMOTES_FILE));
        let mut map: BTreeMap<String, RemoteSpec> =
            config.into_iter().map(|s| (s.name.clone(), s)).collect();
        if let Some(path) = &file {
            for stored in read_stored(path)? {
                if map.contains_key(&stored.name) {
                    tracing::warn!(remote = %stored.name, "remote kept in {} is also in the config; the config's wins", path.display());
                    continue;
                }
                let spec = stored
                    .to_spec(RemoteOrigin::Api)
                    .map_err(|e| RemotesError::Load {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                map.insert(spec.name.clone(), spec);
            }
        }
        Ok(Remotes {
            map: Mutex::new(map),
            file,
        })
    }

    pub fn list(&self) -> Vec<RemoteSpec> {
        self.map.lock().values().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Result<RemoteSpec, RemotesError> {
        self.map
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| RemotesError::NotFound(name.to_owned()))
    }

    /// Adds an API remote and saves the API remotes.
    pub fn add(&self, stored: &StoredRemote) -> Result<RemoteSpec, RemotesError> {
        let spec = stored.to_spec(RemoteOrigin::Api)?;
        let mut map = self.map.lock();
        if map.contains_key(&spec.name) {
            return Err(RemotesError::Exists(spec.name));
        }
        map.insert(spec.name.clone(), spec.clone());
        if let Err(e) = self.save(&map) {
            map.remove(&spec.name);
            return Err(e);
        }
        tracing::info!(remote = %spec.name, url = %spec.url, "remote added");
        Ok(spec)
    }

    /// Removes an API remote (its snapshots stay in the bucket).
    pub fn remove(&self, name: &str) -> Result<RemoteSpec, RemotesError> {
        let mut map = self.map.lock();
        let spec = map
            .get(name)
            .cloned()
            .ok_or_else(|| RemotesError::NotFound(name.to_owned()))?;
        if spec.origin == RemoteOrigin::Config {
            return Err(RemotesError::FromConfig(name.to_owned()));
        }
        map.remove(name);
        if let Err(e) = self.save(&map) {
            map.insert(name.to_owned(), spec);
            return Err(e);
        }
        tracing::info!(remote = %name, "remote removed (its snapshots stay in the bucket)");
        Ok(spec)
    }

    /// Writes the API remotes whole (`paths::replace_private_file`: 0600,
    /// atomic and durable).
    fn save(&self, map: &BTreeMap<String, RemoteSpec>) -> Result<(), RemotesError> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let stored: Vec<StoredRemote> = map
            .values()
            .filter(|s| s.origin == RemoteOrigin::Api)
            .map(RemoteSpec::stored)
            .collect();
        let text = serde_json::to_vec_pretty(&stored).expect("remotes serialize");
        crate::paths::replace_private_file(path, &text).map_err(|e| RemotesError::Save {
            path: e.path,
            source: e.source,
        })
    }
}

fn read_stored(path: &Path) -> Result<Vec<StoredRemote>, RemotesError> {
    let bad = |reason: String| RemotesError::Load {
        path: path.to_owned(),
        reason,
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(bad(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(name: &str) -> StoredRemote {
        StoredRemote {
            name: name.into(),
            url: "s3://bucket-a/p".into(),
            endpoint: Some("http://127.0.0.1:3900".into()),
            region: None,
            credentials_file: None,
            encrypt_key_file: None,
            chunk_bytes: None,
        }
    }

    #[test]
    fn api_remotes_persist_0600_and_config_ones_stay() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let r = Remotes::load(Vec::new(), Some(dir.path())).unwrap();
        r.add(&stored("a")).unwrap();
        assert!(matches!(r.add(&stored("a")), Err(RemotesError::Exists(_))));
        let mode = std::fs::metadata(dir.path().join(REMOTES_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let cfg = stored("c").to_spec(RemoteOrigin::Config).unwrap();
        let r = Remotes::load(vec![cfg], Some(dir.path())).unwrap();
        assert_eq!(r.list().len(), 2);
        assert!(matches!(r.remove("c"), Err(RemotesError::FromConfig(_))));
        r.remove("a").unwrap();
        assert!(Remotes::load(Vec::new(), Some(dir.path()))
            .unwrap()
            .list()
            .is_empty());
    }

    #[test]
    fn bad_values_are_refused() {
        let mut s = stored("Bad");
        assert!(matches!(
            s.to_spec(RemoteOrigin::Api),
            Err(RemotesError::Name(_))
        ));
        s.name = "ok".into();
        s.url = "http://x".into();
        assert!(matches!(
            s.to_spec(RemoteOrigin::Api),
            Err(RemotesError::Url(_))
        ));
        s.url = "s3://bucket".into();
        s.credentials_file = Some("rel/creds".into());
        assert!(s.to_spec(RemoteOrigin::Api).is_err());
        s.credentials_file = None;
        s.chunk_bytes = Some(100_000);
        assert!(matches!(
            s.to_spec(RemoteOrigin::Api),
            Err(RemotesError::ChunkSize { .. })
        ));
        s.chunk_bytes = Some(256 << 10);
        assert_eq!(
            s.to_spec(RemoteOrigin::Api).unwrap().chunk_bytes(),
            256 << 10
        );
        assert_eq!(parse_chunk_size("4M").unwrap(), 4 << 20);
        assert!(parse_chunk_size("32K").is_err());
    }

    #[test]
    fn debug_never_shows_inline_secrets() {
        let entry: RemoteEntry = toml::from_str(
            "name = \"x\"\nurl = \"s3://bucket/p\"\naccess_key_id = \"GK1\"\nsecret_access_key = \"topsecret\"\n",
        )
        .unwrap();
        let spec = entry.to_spec().unwrap();
        assert!(!format!("{spec:?}").contains("topsecret"));
        assert_eq!(spec.credentials_source(), "config");
    }
}
