//! The API client's calls for `/v1/bench/latest` (`ramd bench` stores its
//! report there for the dashboard).

use hyper::Method;

use super::{Client, ClientError};
use crate::api::wire::bench::BenchLatest;

impl Client {
    /// The last report the daemon keeps (`no_bench_results` before one).
    pub fn bench_latest(&self) -> Result<BenchLatest, ClientError> {
        self.call(Method::GET, "/v1/bench/latest", None::<&()>)
    }

    /// Replaces the report the daemon keeps.
    pub fn put_bench_latest(&self, latest: &BenchLatest) -> Result<BenchLatest, ClientError> {
        self.call(Method::PUT, "/v1/bench/latest", Some(latest))
    }
}
