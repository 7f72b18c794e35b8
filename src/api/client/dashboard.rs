//! The API client's call for the dashboard: `POST /v1/dashboard/links`
//! (`ramd dashboard`).

use hyper::Method;

use super::{Client, ClientError};
use crate::api::wire::dashboard::{CreateDashboardLink, DashboardLink};

impl Client {
    /// A dashboard URL with a fresh token (unix socket only).
    pub fn dashboard_link(&self, req: &CreateDashboardLink) -> Result<DashboardLink, ClientError> {
        self.call(Method::POST, "/v1/dashboard/links", Some(req))
    }
}
