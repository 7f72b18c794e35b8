//! The API client's calls for the dashboard: `POST /v1/dashboard/links`
//! (`ramd dashboard`) and `GET /v1/whoami`.

use hyper::Method;

use super::{Client, ClientError};
use crate::api::wire::dashboard::{CreateDashboardLink, DashboardLink, Whoami};

impl Client {
    /// A dashboard URL with a fresh token (unix socket only).
    pub fn dashboard_link(&self, req: &CreateDashboardLink) -> Result<DashboardLink, ClientError> {
        self.call(Method::POST, "/v1/dashboard/links", Some(req))
    }

    /// What the client's credentials allow.
    pub fn whoami(&self) -> Result<Whoami, ClientError> {
        self.call(Method::GET, "/v1/whoami", None::<&()>)
    }
}
