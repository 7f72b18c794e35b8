//! The API client's calls for `/v1/caches` (used by `ramd cache ...` and
//! `ramd sync`).

use std::time::Duration;

use hyper::Method;

use super::{enc, Client, ClientError};
use crate::api::wire::caches::{
    CacheDeleted, CacheInfo, CacheList, CacheSynced, CreateCache, PatchCache,
};

/// Longest wait for a sync or delete: writing a big cache back to a slow
/// disk takes as long as the disk needs (the daemon finishes it either
/// way; Ctrl-C only stops waiting).
pub const WRITE_BACK_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Client {
    pub fn list_caches(&self) -> Result<CacheList, ClientError> {
        self.call(Method::GET, "/v1/caches", None::<&()>)
    }

    pub fn cache(&self, name: &str) -> Result<CacheInfo, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/caches/{}", enc(name)),
            None::<&()>,
        )
    }

    pub fn patch_cache(&self, name: &str, req: &PatchCache) -> Result<CacheInfo, ClientError> {
        self.call(
            Method::PATCH,
            &format!("/v1/caches/{}", enc(name)),
            Some(req),
        )
    }

    pub fn create_cache(&self, req: &CreateCache) -> Result<CacheInfo, ClientError> {
        self.call(Method::POST, "/v1/caches", Some(req))
    }

    pub fn delete_cache(&self, name: &str, force: bool) -> Result<CacheDeleted, ClientError> {
        let q = if force { "?force=true" } else { "" };
        self.call_within(
            Method::DELETE,
            &format!("/v1/caches/{}{q}", enc(name)),
            None::<&()>,
            WRITE_BACK_TIMEOUT,
        )
    }

    pub fn sync_cache(&self, name: &str) -> Result<CacheSynced, ClientError> {
        self.call_within(
            Method::POST,
            &format!("/v1/caches/{}/sync", enc(name)),
            None::<&()>,
            WRITE_BACK_TIMEOUT,
        )
    }
}
