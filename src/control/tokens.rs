//! Bearer tokens for the REST API over TCP (`--api-listen`): made, listed
//! and revoked through the unix socket only (`ramd token ...`), checked by
//! `api::server::auth` on every TCP request.
//!
//! A token is `ramd_<id>_<secret>`: `id` is 6 random bytes in hex (public:
//! it names the token in lists and logs), `secret` 32 random bytes
//! (256 bits, ring's `SystemRandom`) in unpadded base64url. It is shown
//! once, when made; the daemon keeps only the SHA-256 of the whole token
//! string and compares hashes in constant time.
//!
//! ```text
//! STATE_DIR/api-tokens.json   mode 0600, replaced atomically (tmp, fsync, rename, fsync dir)
//! { "version": 1,
//!   "tokens": [ { "name": "ci", "id": "3f2a9c1e5b7d", "role": "admin",
//!                 "created_unix_s": 1764000000, "sha256": "<64 hex digits>" },
//!               { "name": "dashboard-1a2b3c4d", ..., "expires_unix_s": 1764604800 } ] }
//! ```
//!
//! A token may expire (`expires_unix_s`; `ramd dashboard` gives its
//! tokens 7 days by default, so links made day after day do not pile up
//! as live credentials): from then on it is refused as expired
//! ([`Refused::Expired`], 401 `token_expired`), and the next change of
//! the file (a token made or revoked) deletes it. Tokens without the field
//! never expire; a daemon older than the field refuses a file holding one.
//!
//! A file that group or others may read, or that another user owns, is
//! refused (the daemon does not start): whoever could read it could not
//! log in with it, but they could try secrets offline against the
//! hashes, and a file someone else can write could hold their token.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use parking_lot::RwLock;
use ring::rand::SecureRandom;
use serde::{Deserialize, Serialize};

use super::ledger::now_unix_s;

/// The tokens file, in the state directory.
pub const TOKENS_FILE: &str = "api-tokens.json";
/// What every token starts with (so a leaked one is easy to grep for).
pub const TOKEN_PREFIX: &str = "ramd_";
/// Random bytes of a secret: 256 bits.
const SECRET_BYTES: usize = 32;
/// Random bytes of an id (12 hex digits).
const ID_BYTES: usize = 6;
/// Most tokens the file holds (a bound on the file and on `list`).
const MAX_TOKENS: usize = 1024;
const FILE_VERSION: u32 = 1;

/// What a token may do over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Reads only: GET and HEAD.
    ReadOnly,
    /// Every route (token management excepted: unix socket only).
    Admin,
}

/// A token as the daemon shows it: never its secret nor its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub name: String,
    pub id: String,
    pub role: Role,
    pub created_unix_s: u64,
    /// Refused from this second on (None: never).
    pub expires_unix_s: Option<u64>,
}

impl Token {
    /// True once `now_unix_s` has reached the expiry.
    pub fn expired_at(&self, now_unix_s: u64) -> bool {
        self.expires_unix_s.is_some_and(|e| now_unix_s >= e)
    }
}

/// Why a presented token does not authorize anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not one of the daemon's tokens (never made, revoked, malformed, or
    /// expired and deleted since).
    Unknown,
    /// One of the daemon's tokens, past its expiry.
    Expired(Token),
}

/// A token just made: the only time its secret exists outside the client.
pub struct NewToken {
    pub token: Token,
    /// `ramd_<id>_<secret>`.
    pub secret: String,
}

/// One line of the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    name: String,
    id: String,
    role: Role,
    created_unix_s: u64,
    /// SHA-256 of the whole token string, lowercase hex.
    sha256: String,
    /// Refused from this second on; absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_unix_s: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    version: u32,
    tokens: Vec<Record>,
}

/// Why the tokens could not be loaded or changed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Group or others may read (or write) the file.
    #[error("{} has mode {mode:04o}: the API token hashes must be private to the daemon's user; run `chmod 600 {}` (or delete the file and make new tokens)", path.display(), path.display())]
    Exposed { path: PathBuf, mode: u32 },
    /// Another user owns the file.
    #[error("{} belongs to uid {owner}, not to the daemon's user (uid {me}); remove it or chown it", path.display())]
    NotOwner { path: PathBuf, owner: u32, me: u32 },
    /// Reading or writing the file failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a tokens file this version reads.
    #[error("{} is not a ramd tokens file (version {FILE_VERSION}): {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// A name outside the naming rule.
    #[error("invalid token name '{0}': use 1-64 of a-z 0-9 _ -, starting with a letter or digit")]
    BadName(String),
    /// A token of that name exists.
    #[error("a token named '{0}' exists (names are unique; revoke it first or pick another)")]
    Taken(String),
    /// No token of that name.
    #[error("no token named '{0}' (see `ramd token list`)")]
    NotFound(String),
    /// The file is full.
    #[error("{MAX_TOKENS} tokens exist already: revoke some first")]
    TooMany,
    /// The system's random source failed.
    #[error("the system's random number generator failed")]
    Random,
}

/// The tokens, in memory and in their file.
pub struct Tokens {
    path: PathBuf,
    /// Read on every TCP request, written when a token is made or
    /// revoked (a parking_lot lock, never held across `.await`; the file
    /// is written while it is held so file and memory change together).
    records: RwLock<Vec<Record>>,
    /// Counts revocations, so long-lived answers made with a token (the
    /// event stream) end as soon as it is revoked (`revocations`).
    revoked: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("path", &self.path).finish()
    }
}

impl Tokens {
    /// Loads `STATE_DIR/api-tokens.json` (none yet: no tokens).
    pub fn load(state_dir: &Path) -> Result<Tokens, TokenError> {
        let path = state_dir.join(TOKENS_FILE);
        let records = match std::fs::metadata(&path) {
            Ok(meta) => {
                check_private(&path, &meta)?;
                read_file(&path)?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(io("inspect", &path)(source)),
        };
        Ok(Tokens {
            path,
            records: RwLock::new(records),
            revoked: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The token with the public id `id`, if it exists and has not
    /// expired (a dashboard session holds the id of the token it was
    /// made from, never its secret: `control::sessions`).
    pub fn by_id(&self, id: &str) -> Result<Token, Refused> {
        let records = self.records.read();
        let token = records
            .iter()
            .find(|r| r.id == id)
            .ok_or(Refused::Unknown)?
            .token();
        if token.expired_at(now_unix_s()) {
            return Err(Refused::Expired(token));
        }
        Ok(token)
    }

    /// Changes whenever a token is revoked.
    pub fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revoked.subscribe()
    }

    /// The token `presented` stands for, if it is one that exists and
    /// has not expired.
    pub fn verify(&self, presented: &str) -> Result<Token, Refused> {
        let id = parse_id(presented).ok_or(Refused::Unknown)?;
        let hash = sha256_hex(presented);
        let records = self.records.read();
        let r = records
            .iter()
            .find(|r| r.id == id)
            .filter(|r| same_bytes(r.sha256.as_bytes(), hash.as_bytes()))
            .ok_or(Refused::Unknown)?;
        let token = r.token();
        if token.expired_at(now_unix_s()) {
            return Err(Refused::Expired(token));
        }
        Ok(token)
    }

    /// Every token, oldest first.
    pub fn list(&self) -> Vec<Token> {
        self.records.read().iter().map(Record::token).collect()
    }

    /// Makes a token that never expires (named `name`, else by its id)
    /// and saves the file.
    pub fn create(&self, role: Role, name: Option<&str>) -> Result<NewToken, TokenError> {
        self.create_expiring(role, name, None)
    }

    /// Makes a token refused from `expires_unix_s` on (None: never) and
    /// saves the file, without the tokens that have expired.
    pub fn create_expiring(
        &self,
        role: Role,
        name: Option<&str>,
        expires_unix_s: Option<u64>,
    ) -> Result<NewToken, TokenError> {
        let rng = ring::rand::SystemRandom::new();
        let id = hex(&random::<ID_BYTES>(&rng)?);
        let secret =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random::<SECRET_BYTES>(&rng)?);
        let secret = format!("{TOKEN_PREFIX}{id}_{secret}");
        let name = name.map_or_else(|| id.clone(), str::to_owned);
        check_name(&name)?;
        let record = Record {
            name,
            id,
            role,
            created_unix_s: now_unix_s(),
            sha256: sha256_hex(&secret),
            expires_unix_s,
        };
        let mut records = self.records.write();
        let mut next = unexpired(&records, record.created_unix_s);
        if next.iter().any(|r| r.name == record.name) {
            return Err(TokenError::Taken(record.name));
        }
        if next.len() >= MAX_TOKENS {
            return Err(TokenError::TooMany);
        }
        next.push(record.clone());
        write_file(&self.path, &next)?;
        *records = next;
        Ok(NewToken {
            token: record.token(),
            secret,
        })
    }

    /// Forgets the token named `name` (its next request gets 401), and
    /// the tokens that have expired.
    pub fn revoke(&self, name: &str) -> Result<Token, TokenError> {
        let mut records = self.records.write();
        let i = records
            .iter()
            .position(|r| r.name == name)
            .ok_or_else(|| TokenError::NotFound(name.to_owned()))?;
        let gone = records[i].clone();
        let next: Vec<Record> = unexpired(&records, now_unix_s())
            .into_iter()
            .filter(|r| r.name != name)
            .collect();
        write_file(&self.path, &next)?;
        *records = next;
        drop(records);
        self.revoked.send_modify(|n| *n += 1);
        Ok(gone.token())
    }
}

impl Record {
    fn token(&self) -> Token {
        Token {
            name: self.name.clone(),
            id: self.id.clone(),
            role: self.role,
            created_unix_s: self.created_unix_s,
            expires_unix_s: self.expires_unix_s,
        }
    }
}

/// The records that have not expired at `now_unix_s`, in order.
fn unexpired(records: &[Record], now_unix_s: u64) -> Vec<Record> {
    records
        .iter()
        .filter(|r| !r.token().expired_at(now_unix_s))
        .cloned()
        .collect()
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TokenError {
    let path = path.to_owned();
    move |source| TokenError::Io { op, path, source }
}

/// Refuses a file others may read or write, or that is not ours.
fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), TokenError> {
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Exposed {
            path: path.to_owned(),
            mode,
        });
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(TokenError::NotOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<Vec<Record>, TokenError> {
    let text = std::fs::read(path).map_err(io("read", path))?;
    let corrupt = |reason: String| TokenError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let file: TokensFile = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
    if file.version != FILE_VERSION {
        return Err(corrupt(format!("version {}", file.version)));
    }
    if let Some(r) = file.tokens.iter().find(|r| !is_hex(&r.sha256, 64)) {
        return Err(corrupt(format!("token '{}' has no valid sha256", r.name)));
    }
    Ok(file.tokens)
}

/// Replaces the file atomically and privately (`paths::replace_private_file`:
/// a 0600 temporary file, fsync, rename, fsync of the directory). A crash
/// leaves the old file or the new one. Callers hold the records' write
/// lock, so writers take turns.
fn write_file(path: &Path, records: &[Record]) -> Result<(), TokenError> {
    let file = TokensFile {
        version: FILE_VERSION,
        tokens: records.to_vec(),
    };
    let mut bytes = serde_json::to_vec_pretty(&file).expect("records serialize");
    bytes.push(b'\n');
    crate::paths::replace_private_file(path, &bytes).map_err(|e| TokenError::Io {
        op: e.op,
        path: e.path,
        source: e.source,
    })
}

/// The id of a string shaped like a token (`ramd_<12 hex>_<secret>`).
fn parse_id(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix(TOKEN_PREFIX)?.split_once('_')?;
    (is_hex(id, 2 * ID_BYTES) && !secret.is_empty()).then_some(id)
}

fn random<const N: usize>(rng: &ring::rand::SystemRandom) -> Result<[u8; N], TokenError> {
    let mut buf = [0u8; N];
    rng.fill(&mut buf).map_err(|_| TokenError::Random)?;
    Ok(buf)
}

/// Equality in time that does not depend on where the bytes differ
/// (ring's own `verify_slices_are_equal` is deprecated as internal).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn sha256_hex(text: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The naming rule of drives: `[a-z0-9][a-z0-9_-]{0,63}`.
fn check_name(name: &str) -> Result<(), TokenError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
        && !name.starts_with(['_', '-']);
    if ok {
        Ok(())
    } else {
        Err(TokenError::BadName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Tokens) {
        let dir = tempfile::tempdir().unwrap();
        let t = Tokens::load(dir.path()).unwrap();
        (dir, t)
    }

    #[test]
    fn a_token_verifies_until_revoked_and_survives_a_reload() {
        let (dir, t) = store();
        let new = t.create(Role::Admin, Some("ci")).unwrap();
        assert!(new.secret.starts_with(&format!("ramd_{}_", new.token.id)));
        assert_eq!(t.verify(&new.secret).unwrap().name, "ci");
        let again = Tokens::load(dir.path()).unwrap();
        assert_eq!(again.verify(&new.secret).unwrap().role, Role::Admin);
        t.revoke("ci").unwrap();
        assert_eq!(t.verify(&new.secret), Err(Refused::Unknown));
        assert!(Tokens::load(dir.path()).unwrap().list().is_empty());
    }

    #[test]
    fn wrong_secrets_and_malformed_tokens_are_refused() {
        let (_dir, t) = store();
        let new = t.create(Role::ReadOnly, None).unwrap();
        assert_eq!(new.token.name, new.token.id);
        let mut wrong = new.secret.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == 'A' { 'B' } else { 'A' });
        for bad in [
            wrong.as_str(),
            "",
            "ramd_",
            "ramd__x",
            "Bearer x",
            &new.secret[..new.secret.len() - 1],
        ] {
            assert_eq!(t.verify(bad), Err(Refused::Unknown), "{bad}");
        }
    }

    #[test]
    fn the_file_is_private_and_holds_no_secret() {
        let (dir, t) = store();
        let new = t.create(Role::Admin, Some("a")).unwrap();
        let path = dir.path().join(TOKENS_FILE);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        let secret = new.secret.rsplit_once('_').unwrap().1;
        assert!(!text.contains(secret), "{text}");
    }

    #[test]
    fn a_readable_file_is_refused_with_the_fix() {
        let (dir, t) = store();
        t.create(Role::Admin, Some("a")).unwrap();
        let path = dir.path().join(TOKENS_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Tokens::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && e.contains("0644"), "{e}");
    }

    #[test]
    fn expired_tokens_are_refused_as_such_then_deleted() {
        let (dir, t) = store();
        let now = now_unix_s();
        let kept = t.create(Role::Admin, Some("kept")).unwrap();
        let old = t
            .create_expiring(Role::ReadOnly, Some("old"), Some(now - 1))
            .unwrap();
        match t.verify(&old.secret) {
            Err(Refused::Expired(tok)) => assert_eq!(tok.name, "old"),
            other => panic!("{other:?}"),
        }
        let again = Tokens::load(dir.path()).unwrap();
        assert!(matches!(
            again.verify(&old.secret),
            Err(Refused::Expired(_))
        ));
        assert_eq!(again.list().len(), 2);
        // The next change of the file (a revocation here) deletes it.
        t.revoke("kept").unwrap();
        assert_eq!(t.verify(&old.secret), Err(Refused::Unknown));
        assert_eq!(t.verify(&kept.secret), Err(Refused::Unknown));
        assert!(Tokens::load(dir.path()).unwrap().list().is_empty());
        // One that has not expired works, and keeps its expiry.
        let fresh = t
            .create_expiring(Role::Admin, Some("fresh"), Some(now + 3600))
            .unwrap();
        let again = Tokens::load(dir.path()).unwrap();
        assert_eq!(
            again.verify(&fresh.secret).unwrap().expires_unix_s,
            Some(now + 3600)
        );
        // Tokens that never expire are written without the field, as an
        // older daemon wrote them.
        let forever = t.create(Role::Admin, Some("forever")).unwrap();
        assert_eq!(t.verify(&forever.secret).unwrap().expires_unix_s, None);
        let text = std::fs::read_to_string(dir.path().join(TOKENS_FILE)).unwrap();
        assert_eq!(text.matches("expires_unix_s").count(), 1, "{text}");
        // Making a token deletes the expired ones too.
        t.create_expiring(Role::ReadOnly, Some("gone"), Some(now - 1))
            .unwrap();
        t.create(Role::ReadOnly, Some("next")).unwrap();
        let names: Vec<_> = t.list().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["fresh", "forever", "next"]);
    }

    #[test]
    fn names_are_checked_and_unique() {
        let (_dir, t) = store();
        t.create(Role::Admin, Some("a")).unwrap();
        assert!(matches!(
            t.create(Role::Admin, Some("a")),
            Err(TokenError::Taken(_))
        ));
        for bad in ["", "-x", "A", "a b", &"x".repeat(65)] {
            assert!(matches!(
                t.create(Role::Admin, Some(bad)),
                Err(TokenError::BadName(_))
            ));
        }
        assert!(matches!(t.revoke("nope"), Err(TokenError::NotFound(_))));
    }
}
