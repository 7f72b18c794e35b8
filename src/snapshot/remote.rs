//! Where snapshots live: an S3-compatible bucket and prefix, reached with
//! the `object_store` crate, and the credentials to reach it.
//!
//! # Why `object_store`
//!
//! It is the Apache Arrow project's object-store client, maintained and
//! used in production by DataFusion, Delta Lake and others; it speaks S3
//! with SigV4 signing, retries transient failures with bounded exponential
//! backoff (both bounded here: `max_retries`, `retry_timeout_ms`), has
//! per-request and connect timeouts, streams multipart uploads, and does
//! TLS with rustls and ring (no OpenSSL), like the rest of ramd. The AWS
//! SDK would bring a second HTTP and TLS stack and many more crates; a
//! hand-written S3 client would have to re-do signing and retries. We use
//! the 0.12 line: the newest whose minimum Rust fits ours.
//!
//! # Credentials
//!
//! In order: an explicit credentials file (TOML with `access_key_id`,
//! `secret_access_key`, optional `region`; it must not be readable by
//! group or others), else credentials given in the config, else
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`. The region comes from
//! the config, else the file, else `AWS_REGION`, else `us-east-1`.
//! Secrets never appear in `Debug` output, errors or logs.
//!
//! # Errors
//!
//! `object_store` reports S3 failures as HTTP-ish errors; [`Remote`] turns
//! them into [`RemoteError`]s that say what is wrong and what to do: the
//! endpoint cannot be reached, the bucket does not exist, the credentials
//! are refused, or an object is missing, each naming the remote and object.

use std::fmt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, BackoffConfig, ClientOptions, GetOptions, ObjectStore, PutPayload,
    RetryConfig,
};

/// `s3://BUCKET/PREFIX`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The bucket.
    pub bucket: String,
    /// The key prefix, without leading or trailing '/' ("" for none).
    pub prefix: String,
}

/// A remote URL that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("remote {url:?} is not s3://BUCKET[/PREFIX]")]
pub struct BadRemoteUrl {
    /// What was given.
    pub url: String,
}

impl std::str::FromStr for RemoteUrl {
    type Err = BadRemoteUrl;
    fn from_str(s: &str) -> Result<RemoteUrl, BadRemoteUrl> {
        let bad = || BadRemoteUrl { url: s.to_owned() };
        let rest = s.strip_prefix("s3://").ok_or_else(bad)?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        let prefix = prefix.trim_matches('/');
        if !bucket_ok || prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
            return Err(bad());
        }
        Ok(RemoteUrl {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}", self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

/// An access key pair. `Debug` shows the key id only.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Credentials {
    /// The access key id (not secret: it names the key).
    pub access_key_id: String,
    /// The secret key.
    pub secret_access_key: String,
    /// The region, when the file gives one.
    #[serde(default)]
    pub region: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// Why credentials could not be found or read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The file could not be read.
    #[error("cannot read credentials file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Group or others may read the file (the message names the `chmod`
    /// to run, never the mode: it may reach a caller over TCP).
    #[error(transparent)]
    Permissions(#[from] crate::paths::NotPrivate),
    /// Not the expected TOML. The parser's message is left out: it may
    /// quote the secret.
    #[error(
        "credentials file {path} is not TOML with access_key_id and secret_access_key strings"
    )]
    Format {
        /// The file.
        path: PathBuf,
    },
    /// Nothing anywhere.
    #[error("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give a credentials file")]
    Missing,
}

impl Credentials {
    /// Reads a credentials file (owner-only permissions checked first).
    pub fn from_file(path: &FsPath) -> Result<Credentials, CredentialsError> {
        let read_err = |source| CredentialsError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        crate::paths::check_secret_file("credentials file", path, &meta)?;
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        toml::from_str(&text).map_err(|_| CredentialsError::Format {
            path: path.to_owned(),
        })
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_REGION`).
    pub fn from_env() -> Option<Credentials> {
        let id = std::env::var("AWS_ACCESS_KEY_ID").ok()?;
        let secret = std::env::var("AWS_SECRET_ACCESS_KEY").ok()?;
        Some(Credentials {
            access_key_id: id,
            secret_access_key: secret,
            region: std::env::var("AWS_REGION").ok(),
        })
    }

    /// The credentials to use: the file, else the config's, else the
    /// environment's (see the module docs).
    pub fn resolve(
        file: Option<&FsPath>,
        config: Option<Credentials>,
    ) -> Result<Credentials, CredentialsError> {
        if let Some(path) = file {
            return Credentials::from_file(path);
        }
        config
            .or_else(Credentials::from_env)
            .ok_or(CredentialsError::Missing)
    }
}

/// How to reach a remote.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Bucket and prefix.
    pub url: RemoteUrl,
    /// `http(s)://host:port` of an S3-compatible server; None for AWS.
    pub endpoint: Option<String>,
    /// The region; None: the credentials' region, else `us-east-1`.
    pub region: Option<String>,
    /// Retries of one request after a transient failure (5xx, timeouts,
    /// connection errors), with exponential backoff from 100 ms to 5 s.
    pub max_retries: usize,
    /// No retry starts later than this after the first attempt.
    pub retry_timeout_ms: u64,
    /// Limit for one request, transfer included.
    pub request_timeout_ms: u64,
    /// Limit for opening a connection.
    pub connect_timeout_ms: u64,
}

impl RemoteConfig {
    /// Defaults for `url`: 5 retries within 60 s, 120 s per request,
    /// 10 s to connect.
    pub fn new(url: RemoteUrl) -> RemoteConfig {
        RemoteConfig {
            url,
            endpoint: None,
            region: None,
            max_retries: 5,
            retry_timeout_ms: 60_000,
            request_timeout_ms: 120_000,
            connect_timeout_ms: 10_000,
        }
    }
}

/// A remote operation that failed, said so the user knows what to do.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The configuration is unusable (object_store refused it).
    #[error("remote {remote}: invalid configuration: {detail}")]
    Config {
        /// The remote.
        remote: String,
        /// What object_store said.
        detail: String,
    },
    /// No connection (refused, DNS, TLS, timeout) after the retries.
    #[error("remote {remote}: cannot reach the server ({detail}): check that it runs and that the endpoint is right")]
    Unreachable {
        /// The remote.
        remote: String,
        /// The transport's message.
        detail: String,
    },
    /// The bucket does not exist.
    #[error("remote {remote}: bucket {bucket:?} does not exist: create it, or fix the remote URL")]
    BucketMissing {
        /// The remote.
        remote: String,
        /// The bucket.
        bucket: String,
    },
    /// The server refused the credentials or the request.
    #[error("remote {remote}: access denied ({detail}): check the access key id and secret, and the key's permissions on the bucket")]
    AccessDenied {
        /// The remote.
        remote: String,
        /// The server's reason (no secrets in it).
        detail: String,
    },
    /// An object the operation needs is not there.
    #[error("remote {remote}: object {name} is missing")]
    NotFound {
        /// The remote.
        remote: String,
        /// Its name under the prefix.
        name: String,
    },
    /// Anything else, with the operation and object.
    #[error("remote {remote}: {op} {name} failed: {detail}")]
    Other {
        /// The remote.
        remote: String,
        /// "GET", "PUT", "LIST", ...
        op: &'static str,
        /// The object or prefix.
        name: String,
        /// What object_store said.
        detail: String,
    },
}

/// An object's user metadata: key (without the `x-amz-meta-` prefix) to
/// value.
pub type Metadata = std::collections::HashMap<String, String>;

/// An object seen in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its name under the prefix (`chunks/ab/...`).
    pub name: String,
    /// Last modification time, by the server's clock.
    pub modified: SystemTime,
    /// Size in bytes.
    pub size_bytes: u64,
}

/// A bucket and prefix to read and write objects under. Cheap to clone.
#[derive(Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    /// The prefix ("" for the bucket's root).
    prefix: String,
    /// How errors name this remote: `s3://bucket/prefix` (no secrets).
    label: String,
    bucket: String,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Remote({})", self.label)
    }
}

impl Remote {
    /// A client for `config` (no request is made yet; see [`Remote::check`]).
    pub fn open(config: &RemoteConfig, creds: &Credentials) -> Result<Remote, RemoteError> {
        let label = match &config.endpoint {
            Some(e) => format!("{} at {e}", config.url),
            None => config.url.to_string(),
        };
        let region = config
            .region
            .clone()
            .or_else(|| creds.region.clone())
            .unwrap_or_else(|| "us-east-1".to_owned());
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: config.max_retries,
            retry_timeout: Duration::from_millis(config.retry_timeout_ms),
        };
        let http = config
            .endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        let options = ClientOptions::new()
            .with_allow_http(http)
            .with_timeout(Duration::from_millis(config.request_timeout_ms))
            .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms));
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&config.url.bucket)
            .with_region(region)
            .with_access_key_id(&creds.access_key_id)
            .with_secret_access_key(&creds.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_retry(retry)
            .with_client_options(options);
        if let Some(e) = &config.endpoint {
            b = b.with_endpoint(e);
        }
        let store = b.build().map_err(|e| RemoteError::Config {
            remote: label.clone(),
            detail: e.to_string(),
        })?;
        Ok(Remote {
            store: Arc::new(store),
            prefix: config.url.prefix.clone(),
            label,
            bucket: config.url.bucket.clone(),
        })
    }

    /// A remote over any object store (tests use `object_store::memory`).
    pub fn from_store(store: Arc<dyn ObjectStore>, label: &str) -> Remote {
        Remote {
            store,
            prefix: String::new(),
            label: label.to_owned(),
            bucket: label.to_owned(),
        }
    }

    /// How errors name this remote.
    pub fn label(&self) -> &str {
        &self.label
    }

    fn path(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }

    fn name_of(&self, p: &Path) -> String {
        let s = p.as_ref();
        if self.prefix.is_empty() {
            s.to_owned()
        } else {
            s.strip_prefix(&self.prefix)
                .map(|r| r.trim_start_matches('/'))
                .unwrap_or(s)
                .to_owned()
        }
    }

    /// Turns object_store's error into ours (see the module docs).
    fn error(&self, op: &'static str, name: &str, e: object_store::Error) -> RemoteError {
        classify(&self.label, &self.bucket, op, name, e)
    }

    /// Checks that the bucket exists and the credentials work: one LIST.
    pub async fn check(&self) -> Result<(), RemoteError> {
        let p = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        self.store
            .list_with_delimiter(p.as_ref())
            .await
            .map(|_| ())
            .map_err(|e| self.error("LIST", "/", e))
    }

    /// The object's bytes, or None when it does not exist.
    pub async fn get(&self, name: &str) -> Result<Option<Bytes>, RemoteError> {
        let r = async { self.store.get(&self.path(name)).await?.bytes().await }.await;
        match r {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("GET", name, e)),
        }
    }

    /// The object's user metadata (`x-amz-meta-KEY` on S3, one HEAD), or
    /// None when it does not exist.
    pub async fn metadata(&self, name: &str) -> Result<Option<Metadata>, RemoteError> {
        let opts = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        match self.store.get_opts(&self.path(name), opts).await {
            Ok(r) => Ok(Some(
                r.attributes
                    .iter()
                    .filter_map(|(k, v)| match k {
                        Attribute::Metadata(k) => Some((k.to_string(), v.to_string())),
                        _ => None,
                    })
                    .collect(),
            )),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("HEAD", name, e)),
        }
    }

    /// True when the object exists.
    pub async fn exists(&self, name: &str) -> Result<bool, RemoteError> {
        match self.store.head(&self.path(name)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error("HEAD", name, e)),
        }
    }

    /// Writes the object whole (one PUT; objects above 8 MiB go up as a
    /// multipart upload, so a large manifest is not one huge request).
    pub async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), RemoteError> {
        self.put_with_metadata(name, bytes, &[]).await
    }

    /// [`Remote::put`] with user metadata (`x-amz-meta-KEY: VALUE` on S3;
    /// values must be ASCII).
    pub async fn put_with_metadata(
        &self,
        name: &str,
        bytes: Vec<u8>,
        metadata: &[(&'static str, String)],
    ) -> Result<(), RemoteError> {
        const MULTIPART_ABOVE_BYTES: usize = 8 << 20;
        let path = self.path(name);
        let mut attributes = Attributes::new();
        for (k, v) in metadata {
            attributes.insert(Attribute::Metadata((*k).into()), v.clone().into());
        }
        let r = if bytes.len() <= MULTIPART_ABOVE_BYTES {
            self.store
                .put_opts(&path, PutPayload::from(bytes), attributes.into())
                .await
                .map(|_| ())
        } else {
            let upload = self
                .store
                .put_multipart_opts(&path, attributes.into())
                .await;
            match upload {
                Ok(u) => {
                    let mut w =
                        object_store::WriteMultipart::new_with_chunk_size(u, MULTIPART_ABOVE_BYTES);
                    w.write(&bytes);
                    w.finish().await.map(|_| ())
                }
                Err(e) => Err(e),
            }
        };
        r.map_err(|e| self.error("PUT", name, e))
    }

    /// Deletes the object (no error when it is already gone).
    pub async fn delete(&self, name: &str) -> Result<(), RemoteError> {
        match self.store.delete(&self.path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("DELETE", name, e)),
        }
    }

    /// Every object whose name starts with `dir/`.
    pub async fn list(&self, dir: &str) -> Result<Vec<Listed>, RemoteError> {
        let p = self.path(dir);
        self.store
            .list(Some(&p))
            .map_ok(|m| Listed {
                name: self.name_of(&m.location),
                modified: m.last_modified.into(),
                size_bytes: m.size,
            })
            .try_collect()
            .await
            .map_err(|e| self.error("LIST", dir, e))
    }
}

/// The messages of `e` and its sources, joined.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// The useful part of a long object_store message: the S3 error's code
/// and message when the server sent one, else the transport's cause (the
/// text after object_store's " - " separator).
fn brief(detail: &str) -> String {
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let start = detail.find(&open)? + open.len();
        let len = detail[start..].find(&format!("</{t}>"))?;
        Some(&detail[start..start + len])
    };
    if let (Some(code), Some(msg)) = (tag("Code"), tag("Message")) {
        return format!("{code}: {msg}");
    }
    match detail.rsplit_once(" - ") {
        Some((_, cause)) => cause.trim().to_owned(),
        None => detail.to_owned(),
    }
}

/// S3 error bodies are XML: their text with the five predefined entities
/// turned back into characters (`&apos;` would reach the user as is).
fn unescape_xml(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// The region the server says it expects, when it refused a request for
/// being signed for another one: AWS and MinIO say "expecting 'REGION'",
/// Garage "expected: 'DATE/REGION/s3/aws4_request'".
fn expected_region(detail: &str) -> Option<String> {
    let quoted = |after: &str| {
        let start = detail.find(after)? + after.len();
        let len = detail[start..].find('\'')?;
        Some(detail[start..start + len].to_owned())
    };
    if !detail.contains("AuthorizationHeaderMalformed") {
        return None;
    }
    if let Some(r) = quoted("expecting '") {
        return Some(r);
    }
    let scope = quoted("expected: '")?;
    scope.split('/').nth(1).map(str::to_owned)
}

fn classify(
    remote: &str,
    bucket: &str,
    op: &'static str,
    name: &str,
    e: object_store::Error,
) -> RemoteError {
    let full = unescape_xml(&chain(&e));
    let detail = brief(&full);
    let remote = remote.to_owned();
    if let Some(region) = expected_region(&full) {
        return RemoteError::Config {
            remote,
            detail: format!("the server answers to region '{region}', and the requests were signed for another ({detail}): give the remote that region (`ramd remote add ... --region {region}`, or `region = \"{region}\"` in its config or credentials file)"),
        };
    }
    let has = |needles: &[&str]| needles.iter().any(|n| full.contains(n));
    // A listing answered 404 is a missing bucket (a missing prefix lists
    // as empty).
    let list_404 = op == "LIST" && has(&["404 Not Found"]);
    if list_404 || has(&["NoSuchBucket", "bucket does not exist", "Bucket not found"]) {
        return RemoteError::BucketMissing {
            remote,
            bucket: bucket.to_owned(),
        };
    }
    match e {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            RemoteError::AccessDenied { remote, detail }
        }
        object_store::Error::NotFound { .. } if op == "LIST" => RemoteError::BucketMissing {
            remote,
            bucket: bucket.to_owned(),
        },
        object_store::Error::NotFound { .. } => RemoteError::NotFound {
            remote,
            name: name.to_owned(),
        },
        _ if has(&[
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "403 Forbidden",
            "401 Unauthorized",
        ]) =>
        {
            RemoteError::AccessDenied { remote, detail }
        }
        _ if has(&[
            "error sending request",
            "onnection refused",
            "timed out",
            "dns error",
            "tcp connect",
        ]) =>
        {
            RemoteError::Unreachable { remote, detail }
        }
        _ => RemoteError::Other {
            remote,
            op,
            name: name.to_owned(),
            detail,
        },
    }
}

/// A random u32 from the system generator (object-name suffixes).
pub fn random_u32() -> u32 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 4];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system random generator works");
    u32::from_le_bytes(b)
}

/// Now as Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn urls_parse_and_print() {
        let u: RemoteUrl = "s3://ramd-snaps/host1/drives/".parse().unwrap();
        assert_eq!(u.bucket, "ramd-snaps");
        assert_eq!(u.prefix, "host1/drives");
        assert_eq!(u.to_string(), "s3://ramd-snaps/host1/drives");
        let root: RemoteUrl = "s3://bkt".parse().unwrap();
        assert_eq!(root.prefix, "");
        assert_eq!(root.to_string(), "s3://bkt");
        for bad in [
            "http://bkt/x",
            "s3://",
            "s3://B_K",
            "s3://ok-bucket/a/../b",
            "s3://ok-bucket/a//b",
            "s3://ab",
        ] {
            assert!(bad.parse::<RemoteUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn brief_keeps_the_s3_code_or_the_transport_cause() {
        let xml = "Error performing GET http://h/b in 5ms - Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Forbidden: Invalid signature</Message></Error>";
        assert_eq!(brief(xml), "AccessDenied: Forbidden: Invalid signature");
        let net = "Error performing GET http://h/b in 299ms, after 2 retries - HTTP error: error sending request: tcp connect error: Connection refused (os error 111)";
        assert_eq!(
            brief(net),
            "HTTP error: error sending request: tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(brief("plain"), "plain");
    }

    #[test]
    fn a_wrong_region_says_which_one_the_server_wants() {
        // Garage 2.x, as object_store reports it (the XML escaped).
        let garage = unescape_xml("Error performing GET http://127.0.0.1:3900/backups?list-type=2 in 2ms - Server returned non-2xx status code: 400 Bad Request: <?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AuthorizationHeaderMalformed</Code><Message>Authorization header malformed, unexpected scope: &apos;20261128/us-east-1/s3/aws4_request&apos;, expected: &apos;20261128/garage/s3/aws4_request&apos;</Message><Resource>/backups</Resource><Region>garage</Region></Error>");
        assert!(!garage.contains("&apos;"), "{garage}");
        assert_eq!(expected_region(&garage).as_deref(), Some("garage"));
        assert_eq!(
            brief(&garage),
            "AuthorizationHeaderMalformed: Authorization header malformed, unexpected scope: '20261128/us-east-1/s3/aws4_request', expected: '20261128/garage/s3/aws4_request'"
        );
        let aws = "<Error><Code>AuthorizationHeaderMalformed</Code><Message>The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-1'</Message><Region>eu-west-1</Region></Error>";
        assert_eq!(expected_region(aws).as_deref(), Some("eu-west-1"));
        assert_eq!(
            expected_region("<Code>AccessDenied</Code> expecting 'x'"),
            None
        );
        assert_eq!(unescape_xml("a &amp;lt; b &lt; c"), "a &lt; b < c");
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let c = Credentials {
            access_key_id: "GKabc".into(),
            secret_access_key: "topsecret".into(),
            region: None,
        };
        let d = format!("{c:?}");
        assert!(d.contains("GKabc") && !d.contains("topsecret"), "{d}");
    }

    #[test]
    fn credentials_file_is_checked_and_wins() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("creds.toml");
        std::fs::write(
            &p,
            "access_key_id = \"GK1\"\nsecret_access_key = \"s3cr3t\"\nregion = \"garage\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = Credentials::resolve(Some(&p), None).unwrap_err();
        assert!(matches!(e, CredentialsError::Permissions(_)), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("`chmod 600 {}`", p.display())),
            "{e}"
        );
        assert!(!e.to_string().contains("640"), "no mode in messages: {e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let other = Credentials {
            access_key_id: "GK2".into(),
            secret_access_key: "x".into(),
            region: None,
        };
        let c = Credentials::resolve(Some(&p), Some(other.clone())).unwrap();
        assert_eq!(
            (c.access_key_id.as_str(), c.region.as_deref()),
            ("GK1", Some("garage"))
        );
        assert_eq!(
            Credentials::resolve(None, Some(other.clone())).unwrap(),
            other
        );
        std::fs::write(
            &p,
            "access_key_id = \"GK1\"\nsecret_access_key = s3cr3t-unquoted\n",
        )
        .unwrap();
        let e = Credentials::from_file(&p).unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }
}
