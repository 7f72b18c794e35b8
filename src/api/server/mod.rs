//! The server side of REST API v1 over the daemon's unix socket and,
//! with `--api-listen`, over TCP (`tcp`: TLS, every request behind a
//! bearer token checked by `auth`) (axum on tokio): handlers, the route
//! table and the mapping of errors to HTTP.
//!
//! One file per resource: `drives`, `persistence`, `stats`, `health`,
//! `attachments`, `caches` (RAM caches), `dirs` (directories in RAM),
//! `tls` (certificate reload), `tokens` (API tokens), `remotes` and
//! `snapshots` (drive and cache snapshots in object storage), `bench` (the last
//! `ramd bench` report), `events` (server-sent events), `dashboard` (the
//! web UI of `--http`, with `session`, its cookie), `metrics` (Prometheus); `error` the one error shape, `counters` the
//! conversion of metrics into wire counters. The JSON bodies are
//! `api::wire`'s. The route table below is the single source of both the
//! router and [`ROUTES`], which a test compares with docs/openapi.yaml.
//!
//! Handlers never hold a lock across `.await`: registry and mount work runs
//! in `spawn_blocking`.

pub mod attachments;
pub mod auth;
pub mod bench;
pub mod caches;
pub mod conns;
pub mod counters;
pub mod dashboard;
pub mod dir_wire;
pub mod dirs;
pub mod drives;
pub mod error;
pub mod events;
pub mod health;
pub mod host_paths;
pub mod metrics;
pub mod persistence;
pub mod remotes;
pub mod session;
pub mod snapshots;
pub mod stats;
pub mod tcp;
pub mod throttle;
pub mod tls;
pub mod tokens;
pub mod upgrade;

use std::future::Future;
use std::sync::Arc;

use axum::extract::{ConnectInfo, MatchedPath, OriginalUri, Request};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::Router;

use crate::control::Daemon;
pub use error::ApiError;

/// Builds the router and the list of routes from one table.
macro_rules! routes {
    ($( $method:ident $path:literal => $handler:path ),* $(,)?) => {
        /// Every route as (METHOD, path), exactly as the router serves them.
        pub const ROUTES: &[(&str, &str)] = &[$( (stringify!($method), $path) ),*];

        fn routes() -> Router<Arc<Daemon>> {
            let r = Router::new();
            $( let r = r.route($path, axum::routing::$method($handler)); )*
            r
        }
    };
}

routes! {
    get "/v1/health" => health::get,
    get "/v1/drives" => drives::list,
    post "/v1/drives" => drives::create,
    get "/v1/drives/{name}" => drives::get,
    patch "/v1/drives/{name}" => drives::patch,
    delete "/v1/drives/{name}" => drives::delete,
    post "/v1/drives/{name}/sync" => persistence::sync,
    post "/v1/drives/{name}/restore" => drives::restore,
    get "/v1/drives/{name}/stats" => stats::drive,
    get "/v1/drives/{name}/snapshots" => snapshots::status,
    post "/v1/drives/{name}/snapshots" => snapshots::create,
    get "/v1/stats" => stats::all,
    get "/v1/attachments" => attachments::list,
    post "/v1/attachments" => attachments::create,
    delete "/v1/attachments/{id}" => attachments::delete,
    get "/v1/caches" => caches::list,
    post "/v1/caches" => caches::create,
    get "/v1/caches/{name}" => caches::get,
    patch "/v1/caches/{name}" => caches::patch,
    delete "/v1/caches/{name}" => caches::delete,
    post "/v1/caches/{name}/sync" => caches::sync,
    get "/v1/caches/{name}/snapshots" => snapshots::status_cache,
    post "/v1/caches/{name}/snapshots" => snapshots::create_cache,
    get "/v1/dirs" => dirs::list,
    post "/v1/dirs" => dirs::add,
    post "/v1/dirs/sync" => dirs::sync_all,
    get "/v1/dirs/{id}" => dirs::get,
    patch "/v1/dirs/{id}" => dirs::patch,
    delete "/v1/dirs/{id}" => dirs::delete,
    post "/v1/dirs/{id}/sync" => dirs::sync,
    post "/v1/tls/reload" => tls::reload,
    post "/v1/upgrade" => upgrade::upgrade,
    get "/v1/tokens" => tokens::list,
    post "/v1/tokens" => tokens::create,
    delete "/v1/tokens/{name}" => tokens::revoke,
    get "/v1/remotes" => remotes::list,
    post "/v1/remotes" => remotes::add,
    get "/v1/remotes/{name}" => remotes::get,
    delete "/v1/remotes/{name}" => remotes::remove,
    get "/v1/snapshots" => snapshots::list,
    post "/v1/snapshots/prune" => snapshots::prune,
    post "/v1/snapshots/restore" => snapshots::restore,
    get "/v1/snapshots/jobs/{id}" => snapshots::job,
    delete "/v1/snapshots/{remote}/{drive}/{id}" => snapshots::delete,
    get "/v1/bench/latest" => bench::get,
    put "/v1/bench/latest" => bench::put,
    get "/v1/events" => events::stream,
    get "/v1/whoami" => dashboard::api::whoami,
    post "/v1/dashboard/links" => dashboard::api::create_link,
    get "/metrics" => metrics::get,
}

async fn no_route(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        format!(
            "no route {method} {}; the routes are listed in docs/api.md",
            uri.path()
        ),
    )
}

async fn wrong_method(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not support {method}; see docs/api.md", uri.path()),
    )
}

/// The routes that take query parameters; their `Query` extractors refuse
/// unknown or malformed ones (400 `unknown_field` / `bad_query`).
pub const QUERY_ROUTES: &[(&str, &str)] = &[
    ("DELETE", "/v1/drives/{name}"),
    ("DELETE", "/v1/caches/{name}"),
    ("DELETE", "/v1/dirs/{id}"),
    ("GET", "/v1/snapshots"),
    ("GET", "/v1/events"),
];

/// Refuses a query string on a route that takes none (400
/// `unknown_field`), so a mistyped `?force=true` is never silently
/// ignored.
async fn refuse_unknown_query(
    matched: Option<MatchedPath>,
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let query = req.uri().query().filter(|q| !q.is_empty());
    if let (Some(query), Some(route)) = (query, &matched) {
        if !QUERY_ROUTES.contains(&(req.method().as_str(), route.as_str())) {
            let message = format!(
                "{} {} takes no query parameters (got '{query}'); see docs/api.md",
                req.method(),
                req.uri().path()
            );
            return ApiError::new(StatusCode::BAD_REQUEST, "unknown_field", message)
                .into_response();
        }
    }
    next.run(req).await
}

/// The routes with their refusals (unknown route, method, query).
fn app() -> Router<Arc<Daemon>> {
    with_fallbacks(api_routes())
}

/// The API's routes with their query refusals (routes added to the
/// result later keep their own query rules: the dashboard's `/?token=`).
pub(crate) fn api_routes() -> Router<Arc<Daemon>> {
    routes().route_layer(axum::middleware::from_fn(refuse_unknown_query))
}

/// `routes` with the refusals of unknown routes and methods.
pub(crate) fn with_fallbacks(routes: Router<Arc<Daemon>>) -> Router<Arc<Daemon>> {
    routes
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
}

/// The API router of the unix socket, with its state.
pub fn router(daemon: Arc<Daemon>) -> Router {
    app()
        .layer(axum::middleware::from_fn(log_request))
        .with_state(daemon)
}

/// The API router of the TCP listener: every route (unknown ones too)
/// behind a bearer token (`auth`). Handlers that ask for the caller's
/// uid get none, as from a socket whose peer the kernel did not name.
pub fn tcp_router(daemon: Arc<Daemon>, gate: auth::Gatekeeper) -> Router {
    app()
        .layer(axum::Extension(ConnectInfo(host_paths::Peer { uid: None })))
        .layer(axum::middleware::from_fn_with_state(
            gate,
            auth::require_token,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(daemon)
}

/// Logs each request at debug level, errors at info: method and path
/// only, never the query string nor a header (tokens travel in both).
/// A 404 is logged at debug too: a lookup that finds nothing is an
/// answer, not a failure, and clients look names up by asking (`ramd
/// info NAME` asks for a drive, then for a cache of that name), so at
/// info every `ramd info CACHE` would log a failure nobody made.
pub(crate) async fn log_request(
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let res = next.run(req).await;
    let status = res.status();
    // 401 and 429 too: `auth` logs refused credentials itself, with the
    // client's address and at most a line per address every few seconds,
    // so a flood of guesses cannot flood the log.
    let quiet = [
        axum::http::StatusCode::NOT_FOUND,
        axum::http::StatusCode::UNAUTHORIZED,
        axum::http::StatusCode::TOO_MANY_REQUESTS,
    ];
    if quiet.contains(&status) {
        tracing::debug!(%method, %path, status = status.as_u16(), "API request refused or not found");
    } else if status.is_client_error() || status.is_server_error() {
        tracing::info!(%method, %path, status = status.as_u16(), "API request failed");
    } else {
        tracing::debug!(%method, %path, status = status.as_u16(), "API request");
    }
    res
}

/// Serves the API on `listener` until `stop` completes, then finishes the
/// requests in flight.
pub async fn serve(
    listener: tokio::net::UnixListener,
    daemon: Arc<Daemon>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // With the caller's credentials (SO_PEERCRED) for handlers that need them.
    let app = router(daemon).into_make_service_with_connect_info::<host_paths::Peer>();
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}

/// Runs blocking work (registry, mounts) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("request task failed: {e}")))?
}
