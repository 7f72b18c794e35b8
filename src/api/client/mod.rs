//! The blocking API client the CLI uses: one HTTP/1.1 request per call over
//! the daemon's unix socket, or over TCP with TLS and a bearer token
//! (`transport`: `--host`), with hyper on a small current-thread runtime.
//!
//! Invariant: it imports only `api::wire` (and std, serde, hyper, tokio,
//! rustls):
//! it knows the daemon only by its API, so it answers with wire types and
//! [`ClientError`], whose `Api` variant carries the daemon's error code and
//! message as the server sent them. `caches` holds the `/v1/caches` calls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{header, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::api::wire::attachments::{AttachmentInfo, AttachmentList, CreateAttachment};
use crate::api::wire::dirs::{
    AddDir, DirInfo, DirList, DirPatched, DirRemoved, DirSyncAll, DirSynced, PatchDir,
};
use crate::api::wire::drives::{CreateDrive, Deleted, DriveInfo, DriveList, PatchDrive};
use crate::api::wire::error::ErrorBody;
use crate::api::wire::health::{Health, UpgradeRequest, Upgrading};
use crate::api::wire::persistence::{RestoreRequest, SyncResult};
use crate::api::wire::stats::{DriveStats, StatsReport};
use crate::api::wire::tls::TlsReloaded;
use crate::api::wire::tokens::{CreateToken, CreatedToken, TokenList, TokenRevoked};

pub mod bench;
pub mod caches;
pub mod dashboard;
pub mod snapshots;
pub mod transport;

pub use transport::{Host, HostError, Target};

/// Longest wait for one API call (drive creation of a huge drive, a mount).
const TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for directory work: filling a RAM copy or syncing a big
/// tree takes as long as the disk needs (Ctrl-C gives up waiting; the
/// daemon finishes the work either way).
const DIR_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("the ramd daemon is not running (no API at {}). Start it with `ramd daemon` (or `systemctl start ramd`), or point to a running one with --api-socket / RAMD_API_SOCKET", socket.display())]
    NotRunning { socket: PathBuf },
    /// The socket belongs to another user.
    #[error("permission denied on {}: the API socket is private to the daemon's user; run as that user (or root)", socket.display())]
    PermissionDenied { socket: PathBuf },
    /// The daemon refused the request.
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// Nothing answers at the `--host` address.
    #[error("cannot reach the ramd API at {url}: {source} (is the daemon started with --api-listen, and --host right?)")]
    Unreachable { url: String, source: std::io::Error },
    /// The exchange itself failed.
    #[error("talking to the daemon at {at}: {source}")]
    Transport {
        /// The socket path or URL.
        at: String,
        #[source]
        source: TransportError,
    },
}

/// How an exchange with the daemon failed, below the API.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Connecting to the socket (other than "nothing listens" and
    /// "permission denied", which have their own [`ClientError`]s).
    #[error(transparent)]
    Connect(std::io::Error),
    /// The TLS handshake with a `--host` failed (often: the daemon's
    /// certificate is not signed by the CA trusted).
    #[error("TLS: {0} (is --ca-cert the CA that signed the daemon's certificate, and does the certificate name the --host?)")]
    Tls(std::io::Error),
    /// A `--host` name that cannot be a certificate's name.
    #[error("'{0}' is not a valid server name for TLS")]
    ServerName(String),
    /// HTTP/1.1 on the connection.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// A request hyper refuses to build.
    #[error(transparent)]
    Request(#[from] hyper::http::Error),
    /// No whole answer within the call's time limit.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A request body that does not encode.
    #[error(transparent)]
    Encode(serde_json::Error),
    /// A success whose body is not the JSON the call expects.
    #[error("unexpected answer: {0}")]
    Decode(serde_json::Error),
    /// A text answer (`/metrics`) that is not UTF-8.
    #[error(transparent)]
    Text(#[from] std::string::FromUtf8Error),
}

impl ClientError {
    /// The API error code, if the daemon answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A client of one daemon.
pub struct Client {
    target: Target,
    /// Runs hyper's futures; one thread, no workers.
    rt: tokio::runtime::Runtime,
}

impl Client {
    /// A client of the daemon on the unix socket `socket`.
    pub fn new(socket: &Path) -> Client {
        Client::to(Target::Unix(socket.to_owned()))
    }

    /// A client of the daemon at `target`.
    pub fn to(target: Target) -> Client {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime starts");
        Client { target, rt }
    }

    /// Where the daemon is (to make another client for another thread).
    pub fn target(&self) -> &Target {
        &self.target
    }

    fn transport(&self, source: impl Into<TransportError>) -> ClientError {
        ClientError::Transport {
            at: self.target.describe(),
            source: source.into(),
        }
    }

    /// Sends one request; returns the body of a success.
    fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, ClientError> {
        self.send_within(method, path, body, TIMEOUT)
    }

    /// [`Client::send`] with its own time limit.
    fn send_within(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let fut = async {
            let req = self.request(method, path, body)?;
            match &self.target {
                Target::Unix(socket) => self.exchange(connect_unix(socket).await?, req).await,
                Target::Host(h) => self.exchange_tcp(h, req).await,
            }
        };
        let (status, bytes) = self
            .rt
            .block_on(async { tokio::time::timeout(timeout, fut).await })
            .map_err(|_| self.transport(TransportError::Timeout(timeout)))??;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => ClientError::Api {
                status: status.as_u16(),
                code: e.error.code,
                message: e.error.message,
            },
            Err(_) => ClientError::Api {
                status: status.as_u16(),
                code: status_code_name(status),
                message: String::from_utf8_lossy(&bytes).into_owned(),
            },
        })
    }

    /// The request, with the Host and, over TCP, the token.
    fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Request<Full<Bytes>>, ClientError> {
        let mut req = Request::builder().method(method).uri(path);
        match &self.target {
            Target::Unix(_) => req = req.header(header::HOST, "ramd"),
            Target::Host(h) => {
                req = req.header(header::HOST, h.authority());
                if let Some(token) = &h.token {
                    req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
                }
            }
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        req.body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.transport(e))
    }

    /// Connects to a `--host` (TLS unless `http://`) and exchanges `req`.
    async fn exchange_tcp(
        &self,
        r: &Host,
        req: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let tcp = tokio::net::TcpStream::connect(r.authority())
            .await
            .map_err(|source| ClientError::Unreachable {
                url: r.url.clone(),
                source,
            })?;
        let Some(config) = &r.tls else {
            return self.exchange(tcp, req).await;
        };
        let name = r
            .server_name()
            .ok_or_else(|| self.transport(TransportError::ServerName(r.host.clone())))?;
        let tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| self.transport(TransportError::Tls(e)))?;
        self.exchange(tls, req).await
    }

    /// One HTTP/1.1 exchange on a connected stream.
    async fn exchange(
        &self,
        stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
        req: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.transport(e))?;
        tokio::spawn(conn);
        let res = sender
            .send_request(req)
            .await
            .map_err(|e| self.transport(e))?;
        let status = res.status();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map_err(|e| self.transport(e))?
            .to_bytes();
        Ok((status, bytes))
    }

    pub(crate) fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        self.call_within(method, path, body, TIMEOUT)
    }

    pub(crate) fn call_within<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| self.transport(TransportError::Encode(e)))?;
        let bytes = self.send_within(method, path, body, timeout)?;
        serde_json::from_slice(&bytes).map_err(|e| self.transport(TransportError::Decode(e)))
    }

    pub fn health(&self) -> Result<Health, ClientError> {
        self.call(Method::GET, "/v1/health", None::<&()>)
    }

    pub fn list_drives(&self) -> Result<DriveList, ClientError> {
        self.call(Method::GET, "/v1/drives", None::<&()>)
    }

    pub fn drive(&self, name: &str) -> Result<DriveInfo, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/drives/{}", enc(name)),
            None::<&()>,
        )
    }

    pub fn create_drive(&self, req: &CreateDrive) -> Result<DriveInfo, ClientError> {
        self.call(Method::POST, "/v1/drives", Some(req))
    }

    pub fn patch_drive(&self, name: &str, req: &PatchDrive) -> Result<DriveInfo, ClientError> {
        self.call(
            Method::PATCH,
            &format!("/v1/drives/{}", enc(name)),
            Some(req),
        )
    }

    pub fn delete_drive(&self, name: &str, force: bool) -> Result<Deleted, ClientError> {
        self.delete_drive_with(name, force, false)
    }

    /// `DELETE /v1/drives/{name}` with `keep_data` (persistent drives).
    pub fn delete_drive_with(
        &self,
        name: &str,
        force: bool,
        keep_data: bool,
    ) -> Result<Deleted, ClientError> {
        let mut q = Vec::new();
        if force {
            q.push("force=true");
        }
        if keep_data {
            q.push("keep_data=true");
        }
        let q = if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        };
        self.call(
            Method::DELETE,
            &format!("/v1/drives/{}{q}", enc(name)),
            None::<&()>,
        )
    }

    /// `POST /v1/drives/{name}/sync`: returns once the drive is durable.
    pub fn sync_drive(&self, name: &str) -> Result<SyncResult, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/drives/{}/sync", enc(name)),
            None::<&()>,
        )
    }

    /// `POST /v1/drives/{name}/restore` (answers at once, restoring).
    pub fn restore_drive(
        &self,
        name: &str,
        req: &RestoreRequest,
    ) -> Result<DriveInfo, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/drives/{}/restore", enc(name)),
            Some(req),
        )
    }

    pub fn stats(&self) -> Result<StatsReport, ClientError> {
        self.call(Method::GET, "/v1/stats", None::<&()>)
    }

    pub fn drive_stats(&self, name: &str) -> Result<DriveStats, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/drives/{}/stats", enc(name)),
            None::<&()>,
        )
    }

    pub fn attachments(&self) -> Result<AttachmentList, ClientError> {
        self.call(Method::GET, "/v1/attachments", None::<&()>)
    }

    pub fn attach(&self, req: &CreateAttachment) -> Result<AttachmentInfo, ClientError> {
        self.call(Method::POST, "/v1/attachments", Some(req))
    }

    pub fn detach(&self, id: u64) -> Result<AttachmentInfo, ClientError> {
        self.detach_with(id, false)
    }

    /// Detaches; `force` removes a ublk device even while it is in use.
    pub fn detach_with(&self, id: u64, force: bool) -> Result<AttachmentInfo, ClientError> {
        let query = if force { "?force=true" } else { "" };
        self.call(
            Method::DELETE,
            &format!("/v1/attachments/{id}{query}"),
            None::<&()>,
        )
    }

    pub fn list_dirs(&self) -> Result<DirList, ClientError> {
        self.call(Method::GET, "/v1/dirs", None::<&()>)
    }

    /// One directory by id or path.
    pub fn dir(&self, key: &str) -> Result<DirInfo, ClientError> {
        self.call(Method::GET, &format!("/v1/dirs/{}", enc(key)), None::<&()>)
    }

    /// Returns once PATH shows the RAM copy.
    pub fn add_dir(&self, req: &AddDir) -> Result<DirInfo, ClientError> {
        self.call_within(Method::POST, "/v1/dirs", Some(req), DIR_TIMEOUT)
    }

    /// New interval, size limit or recovery generations.
    pub fn patch_dir(&self, key: &str, req: &PatchDir) -> Result<DirPatched, ClientError> {
        self.call(Method::PATCH, &format!("/v1/dirs/{}", enc(key)), Some(req))
    }

    /// Final sync, unmount, forget.
    pub fn remove_dir(&self, key: &str, force: bool) -> Result<DirRemoved, ClientError> {
        let q = if force { "?force=true" } else { "" };
        self.call_within(
            Method::DELETE,
            &format!("/v1/dirs/{}{q}", enc(key)),
            None::<&()>,
            DIR_TIMEOUT,
        )
    }

    /// Returns once the on-disk copy is durable.
    pub fn sync_dir(&self, key: &str) -> Result<DirSynced, ClientError> {
        self.call_within(
            Method::POST,
            &format!("/v1/dirs/{}/sync", enc(key)),
            None::<&()>,
            DIR_TIMEOUT,
        )
    }

    /// Syncs every directory.
    pub fn sync_all_dirs(&self) -> Result<DirSyncAll, ClientError> {
        self.call_within(Method::POST, "/v1/dirs/sync", None::<&()>, DIR_TIMEOUT)
    }

    /// Reads the NBD server's certificates again (`ramd tls reload`).
    pub fn reload_tls(&self) -> Result<TlsReloaded, ClientError> {
        self.call(Method::POST, "/v1/tls/reload", None::<&()>)
    }

    /// `POST /v1/upgrade` (unix socket only): this daemon's serving
    /// process hands over to another binary.
    pub fn upgrade(&self, req: &UpgradeRequest) -> Result<Upgrading, ClientError> {
        self.call(Method::POST, "/v1/upgrade", Some(req))
    }

    /// `GET /v1/tokens`.
    pub fn tokens(&self) -> Result<TokenList, ClientError> {
        self.call(Method::GET, "/v1/tokens", None::<&()>)
    }

    /// `POST /v1/tokens` (unix socket only): the secret, shown once.
    pub fn create_token(&self, req: &CreateToken) -> Result<CreatedToken, ClientError> {
        self.call(Method::POST, "/v1/tokens", Some(req))
    }

    /// `DELETE /v1/tokens/{name}` (unix socket only).
    pub fn revoke_token(&self, name: &str) -> Result<TokenRevoked, ClientError> {
        self.call(
            Method::DELETE,
            &format!("/v1/tokens/{}", enc(name)),
            None::<&()>,
        )
    }

    /// `/metrics` as text.
    pub fn metrics_text(&self) -> Result<String, ClientError> {
        let bytes = self.send(Method::GET, "/metrics", None)?;
        String::from_utf8(bytes).map_err(|e| self.transport(e))
    }
}

/// Connects to the unix socket, naming the two usual failures.
async fn connect_unix(socket: &Path) -> Result<tokio::net::UnixStream, ClientError> {
    use std::io::ErrorKind as K;
    tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| match e.kind() {
            K::NotFound | K::ConnectionRefused => ClientError::NotRunning {
                socket: socket.to_owned(),
            },
            K::PermissionDenied => ClientError::PermissionDenied {
                socket: socket.to_owned(),
            },
            _ => ClientError::Transport {
                at: socket.display().to_string(),
                source: TransportError::Connect(e),
            },
        })
}

fn status_code_name(s: StatusCode) -> String {
    s.canonical_reason()
        .unwrap_or("error")
        .to_ascii_lowercase()
        .replace(' ', "_")
}

/// Percent-encodes a path segment (drive names are plain, but the CLI
/// passes whatever the user typed and the daemon must see it intact).
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
