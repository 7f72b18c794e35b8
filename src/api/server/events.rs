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
//! Bounds: at most [`MAX_STREAMS`] streams at once, and at most
//! [`MAX_STREAMS_PER_TOKEN`] of them on one token (503 `too_many_streams`
//! beyond: each is a task building a report every interval, and one
//! token's tabs or script must not lock every other session out). A
//! stream ends when the daemon stops (`Daemon::stopping`), so the API's
//! graceful shutdown never waits for a browser tab.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use futures::Stream;
use serde::Deserialize;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::auth::Caller;
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
/// How long a browser waits before it reconnects a dropped stream.
const RETRY: Duration = Duration::from_secs(3);
/// A comment this often when no event is due.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One permit per open stream.
static STREAMS: Semaphore = Semaphore::const_new(MAX_STREAMS);
/// Open streams by token id (the unix socket's are not counted here).
static PER_TOKEN: parking_lot::Mutex<BTreeMap<String, usize>> =
    parking_lot::Mutex::new(BTreeMap::new());

/// A token's count of open streams, given back on drop.
struct TokenStreams(String);

impl TokenStreams {
    /// One more stream for token `id`, unless it holds the most already.
    fn take(id: &str) -> Option<TokenStreams> {
        let mut open = PER_TOKEN.lock();
        let n = open.entry(id.to_owned()).or_default();
        if *n >= MAX_STREAMS_PER_TOKEN {
            return None;
        }
        *n += 1;
        Some(TokenStreams(id.to_owned()))
    }
}

impl Drop for TokenStreams {
    fn drop(&mut self) {
        let mut open = PER_TOKEN.lock();
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
    /// The token's count, held while the stream is open.
    _token: Option<TokenStreams>,
}

pub async fn stream(
    State(daemon): State<Arc<Daemon>>,
    caller: Option<Extension<Caller>>,
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
    let token = match caller {
        Some(Extension(Caller(t))) => Some(TokenStreams::take(&t.id).ok_or_else(|| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                format!("token '{}' has {MAX_STREAMS_PER_TOKEN} event streams open already: close some dashboard tabs, or poll GET /v1/stats", t.name),
            )
        })?),
        None => None,
    };
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
        _token: token,
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
        tokio::select! {
            _ = tokio::time::sleep(t.interval) => {}
            _ = t.stopping.wait_for(|stop| *stop) => return None,
        }
    }
    if *t.stopping.borrow() {
        return None;
    }
    let event = stats_event(&t.daemon, t.seq);
    t.seq += 1;
    Some((Ok(event), t))
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
        let id = "events-test-token";
        let mut held: Vec<_> = (0..MAX_STREAMS_PER_TOKEN)
            .map(|_| TokenStreams::take(id).expect("below the bound"))
            .collect();
        assert!(TokenStreams::take(id).is_none());
        let other = TokenStreams::take("events-test-other").expect("another token's own count");
        held.pop();
        held.push(TokenStreams::take(id).expect("a stream closed"));
        drop(held);
        drop(other);
        assert!(!PER_TOKEN.lock().contains_key(id), "forgotten at zero");
    }
}
