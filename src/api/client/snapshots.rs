//! The API client's calls for `/v1/remotes`, `/v1/snapshots`,
//! `/v1/drives/{name}/snapshots` and `/v1/caches/{name}/snapshots` (used by `ramd remote ...`,
//! `ramd snapshot ...` and `ramd restore --from`).

use std::time::Duration;

use hyper::Method;

use super::{enc, Client, ClientError};
use crate::api::wire::snapshots::{
    AddRemote, CreateSnapshot, Job, PruneReport, PruneRequest, RemoteInfo, RemoteList,
    RemoteRemoved, RestoreSnapshot, SnapshotDeleted, SnapshotList, SnapshotStatusList,
};

/// Longest wait for a listing or prune: a big bucket takes many LIST and
/// DELETE requests (the daemon finishes a prune either way).
pub const REMOTE_TIMEOUT: Duration = Duration::from_secs(3600);

impl Client {
    pub fn list_remotes(&self) -> Result<RemoteList, ClientError> {
        self.call(Method::GET, "/v1/remotes", None::<&()>)
    }

    pub fn add_remote(&self, req: &AddRemote) -> Result<RemoteInfo, ClientError> {
        self.call(Method::POST, "/v1/remotes", Some(req))
    }

    pub fn remove_remote(&self, name: &str) -> Result<RemoteRemoved, ClientError> {
        self.call(
            Method::DELETE,
            &format!("/v1/remotes/{}", enc(name)),
            None::<&()>,
        )
    }

    /// Starts a push of `drive`; follow it with [`Client::snapshot_job`].
    pub fn create_snapshot(&self, drive: &str, req: &CreateSnapshot) -> Result<Job, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/drives/{}/snapshots", enc(drive)),
            Some(req),
        )
    }

    /// Starts a push of cache `cache` (written back first).
    pub fn create_cache_snapshot(
        &self,
        cache: &str,
        req: &CreateSnapshot,
    ) -> Result<Job, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/caches/{}/snapshots", enc(cache)),
            Some(req),
        )
    }

    pub fn cache_snapshot_status(&self, cache: &str) -> Result<SnapshotStatusList, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/caches/{}/snapshots", enc(cache)),
            None::<&()>,
        )
    }

    pub fn snapshot_status(&self, drive: &str) -> Result<SnapshotStatusList, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/drives/{}/snapshots", enc(drive)),
            None::<&()>,
        )
    }

    pub fn list_snapshots(
        &self,
        drive: Option<&str>,
        remote: Option<&str>,
    ) -> Result<SnapshotList, ClientError> {
        let mut q: Vec<String> = Vec::new();
        if let Some(d) = drive {
            q.push(format!("drive={}", enc(d)));
        }
        if let Some(r) = remote {
            q.push(format!("remote={}", enc(r)));
        }
        let path = if q.is_empty() {
            "/v1/snapshots".to_owned()
        } else {
            format!("/v1/snapshots?{}", q.join("&"))
        };
        self.call_within(Method::GET, &path, None::<&()>, REMOTE_TIMEOUT)
    }

    pub fn delete_snapshot(
        &self,
        remote: &str,
        drive: &str,
        id: &str,
    ) -> Result<SnapshotDeleted, ClientError> {
        self.call(
            Method::DELETE,
            &format!("/v1/snapshots/{}/{}/{}", enc(remote), enc(drive), enc(id)),
            None::<&()>,
        )
    }

    pub fn prune_snapshots(&self, req: &PruneRequest) -> Result<PruneReport, ClientError> {
        self.call_within(
            Method::POST,
            "/v1/snapshots/prune",
            Some(req),
            REMOTE_TIMEOUT,
        )
    }

    /// Starts a restore into a new drive; follow it with
    /// [`Client::snapshot_job`].
    pub fn restore_snapshot(&self, req: &RestoreSnapshot) -> Result<Job, ClientError> {
        self.call(Method::POST, "/v1/snapshots/restore", Some(req))
    }

    pub fn snapshot_job(&self, id: u64) -> Result<Job, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/snapshots/jobs/{id}"),
            None::<&()>,
        )
    }
}
