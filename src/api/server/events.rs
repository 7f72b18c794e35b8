//! `GET /v1/events`: server-sent events, the feed of the dashboard's live
//! charts (and of any client that would rather not poll).
//!
//! ```text
//! retry: 3000
//! event: stats
//! id: 0
//! data: {"seq":0,"unix_ms":...,"stats":{ GET /v1/stats's body }}
//!                       ... every interval_ms (default 1000, 250-60000) ...
//! : (a comment every 15 s if an interval is longer, so proxies keep the stream open)
//! ```
//!
//! The first event is sent at once, so a page has figures before its
//! first tick. `count=N` ends the stream after N events (`count=1`: one
//! snapshot, for scripts and tests that read to the end). Rates and latencies in each event are the sampler's last
//! full second (`control::sampler`), as in `GET /v1/stats`: an interval
//! below a second repeats figures, one above skips some.
//!
//! Bounds: at most [`MAX_STREAMS`] streams at once, at most
//! [`MAX_STREAMS_PER_TOKEN`] of them on one token and
//! [`MAX_STREAMS_PER_ADDRESS`] from one client address (503
//! `too_many_streams` beyond: each is a task building a report every
//! interval, and one token's tabs, or one address's many tokens, must not
//! lock every other session out). A stream ends when the daemon stops
//! (`Daemon::stopping`), so the API's graceful shutdown never waits for a
//! browser tab; and when its credential ends (the token revoked or
//! expired, the dashboard session signed out), with a last `ended` event
//! saying why, so a page never shows "live" on a credential that is gone.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use futures::Stream;
use serde::Deserialize;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::auth::{Caller, Via};
use super::conns::ConnState;
use super::session;
use super::ApiError;
use crate::api::wire::dashboard::StatsEvent;
use crate::control::Daemon;

pub const DEFAULT_INTERVAL_MS: u64 = 1000;
pub const MIN_INTERVAL_MS: u64 = 250;
pub const MAX_INTERVAL_MS: u64 = 60_000;
/// Most event streams open at once.
pub const MAX_STREAMS: usize = 64;
/// Most event streams open at once on one token (a few dashboard tabs).
pub const MAX_STREAMS_PER_TOKEN: usize = 8;
/// Most event streams open at once from one client address.
pub const MAX_STREAMS_PER_ADDRESS: usize = 8;
/// How often a stream checks that its credential still works, besides
/// every revocation.
const RECHECK: Duration = Duration::from_secs(5);
/// How long a browser waits before it reconnects a dropped stream.
const RETRY: Duration = Duration::from_secs(3);
/// A comment this often when no event is due.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One permit per open stream.
static STREAMS: Semaphore = Semaphore::const_new(MAX_STREAMS);
/// Open streams by `token:ID` and by `addr:IP` (the unix socket's are
/// not counted here).
static PER_KEY: parking_lot::Mutex<BTreeMap<String, usize>> =
    parking_lot::Mutex::new(BTreeMap::new());

/// One more open stream counted under a key, given back on drop.
struct Counted(String);

impl Counted {
    /// One more stream under `key`, unless it holds `most` already.
    fn take(key: String, most: usize) -> Option<Counted> {
        let mut open = PER_KEY.lock();
        let n = open.entry(key.clone()).or_default();
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(Counted(key))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut open = PER_KEY.lock();
        if let Some(n) = open.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.0);
            }
        }
    }
}

/// `GET /v1/events?interval_ms=N&count=N`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    #[serde(default)]
    pub interval_ms: Option<u64>,
    /// Events to send before the stream ends (none: until the client or
    /// the daemon goes).
    #[serde(default)]
    pub count: Option<u64>,
}

/// A stream's state between events.
struct Ticker {
    daemon: Arc<Daemon>,
    seq: u64,
    /// The stream ends once `seq` reaches it.
    count: u64,
    interval: Duration,
    stopping: tokio::sync::watch::Receiver<bool>,
    /// Held while the stream is open.
    _permit: SemaphorePermit<'static>,
    /// The token's and the address's counts, held while the stream is open.
    _counts: Vec<Counted>,
    /// The credential the stream was opened with (None: the unix socket).
    credential: Option<Credential>,
}

/// What a stream re-checks: its token, and its dashboard session if it
/// came with one.
struct Credential {
    token_id: String,
    session: Option<(String, IpAddr)>,
    revoked: tokio::sync::watch::Receiver<u64>,
}

impl Credential {
    /// Why the credential no longer works, if it does not.
    fn ended(&self, d: &Daemon) -> Option<&'static str> {
        if d.tokens.by_id(&self.token_id).is_err() {
            return Some("the token was revoked or has expired");
        }
        let (id, addr) = self.session.as_ref()?;
        d.sessions
            .lookup(id, *addr)
            .is_none()
            .then_some("the dashboard session has ended")
    }
}

pub async fn stream(
    State(daemon): State<Arc<Daemon>>,
    caller: Option<Extension<Caller>>,
    via: Option<Extension<Via>>,
    conn: Option<Extension<Arc<ConnState>>>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let Query(q) = query?;
    let interval_ms = q.interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
    if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&interval_ms) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            format!("interval_ms={interval_ms} is out of range: give {MIN_INTERVAL_MS} to {MAX_INTERVAL_MS}"),
        ));
    }
    let count = q.count.unwrap_or(u64::MAX);
    if count == 0 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "count=0 asks for no events: give at least 1, or leave it out for an endless stream",
        ));
    }
    let addr = conn.map(|Extension(c)| c.addr);
    let mut counts = Vec::new();
    let mut credential = None;
    if let Some(Extension(Caller(t))) = caller {
        let too_many = |what: String| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                format!("{what} has the most event streams open already: close some dashboard tabs, or poll GET /v1/stats"),
            )
        };
        let mine = Counted::take(format!("token:{}", t.id), MAX_STREAMS_PER_TOKEN)
            .ok_or_else(|| too_many(format!("token '{}' ({MAX_STREAMS_PER_TOKEN})", t.name)))?;
        counts.push(mine);
        if let Some(a) = addr {
            let here = Counted::take(format!("addr:{a}"), MAX_STREAMS_PER_ADDRESS)
                .ok_or_else(|| too_many(format!("this address ({MAX_STREAMS_PER_ADDRESS})")))?;
            counts.push(here);
        }
        let cookie = matches!(via, Some(Extension(Via::Cookie)));
        let session = match (cookie, addr) {
            (true, Some(a)) => session::session_ids(&headers)
                .into_iter()
                .find(|id| daemon.sessions.lookup(id, a).as_deref() == Some(&t.id))
                .map(|id| (id.to_owned(), a)),
            _ => None,
        };
        credential = Some(Credential {
            token_id: t.id,
            session,
            revoked: daemon.tokens.revocations(),
        });
    }
    let permit = STREAMS.try_acquire().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            format!("{MAX_STREAMS} event streams are open already: close some dashboard tabs, or poll GET /v1/stats"),
        )
    })?;
    let ticker = Ticker {
        stopping: daemon.stopping.clone(),
        daemon,
        seq: 0,
        count,
        interval: Duration::from_millis(interval_ms),
        _permit: permit,
        _counts: counts,
        credential,
    };
    let events = futures::stream::unfold(ticker, next_event);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

/// The next event after the interval, or the end when the daemon stops
/// or `count` events were sent.
async fn next_event(mut t: Ticker) -> Option<(Result<Event, Infallible>, Ticker)> {
    if t.seq >= t.count {
        return None;
    }
    if t.seq > 0 {
        let tick = tokio::time::Instant::now() + t.interval;
        loop {
            let recheck = tokio::time::Instant::now() + RECHECK;
            tokio::select! {
                _ = tokio::time::sleep_until(tick.min(recheck)) => {}
                _ = t.stopping.wait_for(|stop| *stop) => return None,
                _ = revoked(&mut t.credential) => {}
            }
            if let Some(why) = t.credential.as_ref().and_then(|c| c.ended(&t.daemon)) {
                t.count = t.seq;
                let last = Event::default().event("ended").data(why);
                return Some((Ok(last), t));
            }
            if tokio::time::Instant::now() >= tick {
                break;
            }
        }
    }
    if *t.stopping.borrow() {
        return None;
    }
    let event = stats_event(&t.daemon, t.seq);
    t.seq += 1;
    Some((Ok(event), t))
}

/// Resolves when a token is revoked (never without a credential).
async fn revoked(c: &mut Option<Credential>) {
    match c {
        Some(c) => {
            if c.revoked.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The `stats` event numbered `seq`.
fn stats_event(d: &Daemon, seq: u64) -> Event {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_millis() as u64);
    let body = StatsEvent {
        seq,
        unix_ms,
        stats: super::stats::report(d),
    };
    let event = Event::default().event("stats").id(seq.to_string());
    let event = if seq == 0 { event.retry(RETRY) } else { event };
    match serde_json::to_string(&body) {
        Ok(json) => event.data(json),
        // Plain structs of numbers and strings always encode; say so if
        // one ever does not, rather than end the stream.
        Err(e) => event
            .event("error")
            .data(format!("cannot encode the stats: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_holds_a_bounded_number_of_streams() {
        let key = || "token:events-test-token".to_owned();
        let mut held: Vec<_> = (0..MAX_STREAMS_PER_TOKEN)
            .map(|_| Counted::take(key(), MAX_STREAMS_PER_TOKEN).expect("below the bound"))
            .collect();
        assert!(Counted::take(key(), MAX_STREAMS_PER_TOKEN).is_none());
        let other = Counted::take("token:events-test-other".into(), MAX_STREAMS_PER_TOKEN)
            .expect("another token's own count");
        held.pop();
        held.push(Counted::take(key(), MAX_STREAMS_PER_TOKEN).expect("a stream closed"));
        drop(held);
        drop(other);
        assert!(!PER_KEY.lock().contains_key(&key()), "forgotten at zero");
    }
}
