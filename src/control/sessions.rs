//! The dashboard's sign-in codes and sessions, kept in the daemon's
//! memory only.
//!
//! ```text
//! ramd dashboard ──(unix socket)──► a token (7 days) + a sign-in code for it
//!                                   (one use, CODE_TTL), link https://HOST:PORT/signin#CODE
//! the page /signin ──► POST /session {"code"} ──► code taken (gone) ──► a session id
//!                                                  bound to (token id, client IP address)
//! later requests   ──► Cookie: session id ──► lookup(id, address) ──► token id ──► Tokens
//! ```
//!
//! Invariants and why:
//! - The cookie never holds a token: a cookie is sent to every port of
//!   the host (cookies are not port-scoped), so a token in it would reach
//!   any other web service there, which could then use it as a bearer
//!   token. A session id is useless as a bearer token, and only works as
//!   a cookie from the address that signed in.
//! - A session authorizes what its token does, checked on every request
//!   (`Tokens::by_id`): revoking or expiring the token ends its sessions
//!   at once, with nothing to keep in step.
//! - A code works once and for [`CODE_TTL`]: the link leaves no lasting
//!   credential in browser history, `ps` output or a terminal scrollback.
//!   The code travels in the URL's fragment, which browsers never send to
//!   the server (no access log or proxy sees it), and the page drops it
//!   from the address bar before it exchanges it.
//! - Only hashes are kept (SHA-256 of the code, of the session id); both
//!   are 256 random bits (ring's `SystemRandom`), base64url.
//! - Bounded: at most [`MAX_CODES`] unused codes and [`MAX_SESSIONS`]
//!   sessions; the oldest gives way. Sessions end when the daemon stops
//!   (the page then asks for a new link).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use base64::Engine;
use parking_lot::Mutex;
use ring::rand::SecureRandom;

/// How long a sign-in code works.
pub const CODE_TTL: Duration = Duration::from_secs(5 * 60);
/// Most unused sign-in codes kept.
pub const MAX_CODES: usize = 64;
/// Most sessions kept.
pub const MAX_SESSIONS: usize = 1024;
/// Longest a session lasts (less when its token expires sooner).
pub const MAX_SESSION_LIFE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Random bytes of a code and of a session id.
const SECRET_BYTES: usize = 32;

type Hash = [u8; 32];

/// Why a sign-in code was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeRefused {
    /// Never made, used already, or pushed out by newer codes.
    #[error("this sign-in link was used already or is not one of this daemon's (each link works once): run `ramd dashboard` on the daemon's host again and open the new link")]
    Unknown,
    /// Older than [`CODE_TTL`].
    #[error("this sign-in link has expired (links work for 5 minutes): run `ramd dashboard` on the daemon's host again and open the new link")]
    Expired,
}

/// The system's random source failed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the system's random number generator failed")]
pub struct RandomFailed;

struct Code {
    token_id: String,
    made: Instant,
}

struct Session {
    token_id: String,
    addr: IpAddr,
    made: Instant,
}

/// A session just started: its id goes into the cookie.
pub struct NewSession {
    pub id: String,
    pub token_id: String,
}

/// The codes and sessions of one daemon.
#[derive(Default)]
pub struct Sessions {
    codes: Mutex<HashMap<Hash, Code>>,
    sessions: Mutex<HashMap<Hash, Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("codes", &self.codes.lock().len())
            .field("sessions", &self.sessions.lock().len())
            .finish()
    }
}

impl Sessions {
    /// A new sign-in code for the token `token_id`.
    pub fn new_code(&self, token_id: &str) -> Result<String, RandomFailed> {
        let code = random_text()?;
        let mut codes = self.codes.lock();
        codes.retain(|_, c| c.made.elapsed() < CODE_TTL);
        if codes.len() >= MAX_CODES {
            drop_oldest(&mut codes, |c| c.made);
        }
        let made = Instant::now();
        let token_id = token_id.to_owned();
        codes.insert(hash(&code), Code { token_id, made });
        Ok(code)
    }

    /// Takes the code `code` (it works no more) and starts a session for
    /// its token, bound to the client address `addr`.
    pub fn redeem(&self, code: &str, addr: IpAddr) -> Result<NewSession, RedeemError> {
        let taken = self.codes.lock().remove(&hash(code));
        let code = taken.ok_or(RedeemError::Code(CodeRefused::Unknown))?;
        if code.made.elapsed() >= CODE_TTL {
            return Err(RedeemError::Code(CodeRefused::Expired));
        }
        let id = random_text().map_err(RedeemError::Random)?;
        let mut sessions = self.sessions.lock();
        sessions.retain(|_, s| s.made.elapsed() < MAX_SESSION_LIFE);
        if sessions.len() >= MAX_SESSIONS {
            drop_oldest(&mut sessions, |s| s.made);
        }
        let session = Session {
            token_id: code.token_id.clone(),
            addr,
            made: Instant::now(),
        };
        sessions.insert(hash(&id), session);
        Ok(NewSession {
            id,
            token_id: code.token_id,
        })
    }

    /// The token id of session `id` presented from `addr`: None when no
    /// such session lives, or it was started from another address.
    pub fn lookup(&self, id: &str, addr: IpAddr) -> Option<String> {
        let sessions = self.sessions.lock();
        let s = sessions.get(&hash(id))?;
        (s.addr == addr && s.made.elapsed() < MAX_SESSION_LIFE).then(|| s.token_id.clone())
    }

    /// Ends session `id` (signing out); false when there was none.
    pub fn end(&self, id: &str) -> bool {
        self.sessions.lock().remove(&hash(id)).is_some()
    }

    /// Forgets the codes and sessions of token `token_id` (revoked).
    pub fn end_token(&self, token_id: &str) {
        self.codes.lock().retain(|_, c| c.token_id != token_id);
        self.sessions.lock().retain(|_, s| s.token_id != token_id);
    }

    /// Sessions alive now.
    pub fn count(&self) -> usize {
        self.sessions.lock().len()
    }
}

/// Why [`Sessions::redeem`] started no session.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum RedeemError {
    #[error(transparent)]
    Code(CodeRefused),
    #[error(transparent)]
    Random(RandomFailed),
}

fn drop_oldest<V>(map: &mut HashMap<Hash, V>, made: impl Fn(&V) -> Instant) {
    if let Some(k) = map.iter().min_by_key(|(_, v)| made(v)).map(|(k, _)| *k) {
        map.remove(&k);
    }
}

fn hash(text: &str) -> Hash {
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn random_text() -> Result<String, RandomFailed> {
    let mut buf = [0u8; SECRET_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| RandomFailed)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const ELSEWHERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9));

    #[test]
    fn a_code_works_once_and_its_session_only_from_its_address() {
        let s = Sessions::default();
        let code = s.new_code("t1").unwrap();
        assert_eq!(code.len(), 43);
        let new = s.redeem(&code, HOME).unwrap();
        assert_eq!(new.token_id, "t1");
        assert!(matches!(
            s.redeem(&code, HOME),
            Err(RedeemError::Code(CodeRefused::Unknown))
        ));
        assert_eq!(s.lookup(&new.id, HOME).as_deref(), Some("t1"));
        assert_eq!(s.lookup(&new.id, ELSEWHERE), None);
        assert_eq!(s.lookup(&code, HOME), None, "a code is not a session");
        assert!(s.end(&new.id));
        assert_eq!(s.lookup(&new.id, HOME), None);
        assert!(!s.end(&new.id));
    }

    #[test]
    fn revoking_a_token_ends_its_codes_and_sessions() {
        let s = Sessions::default();
        let a = s.redeem(&s.new_code("a").unwrap(), HOME).unwrap();
        let b = s.redeem(&s.new_code("b").unwrap(), HOME).unwrap();
        let unused = s.new_code("a").unwrap();
        s.end_token("a");
        assert_eq!(s.lookup(&a.id, HOME), None);
        assert_eq!(s.lookup(&b.id, HOME).as_deref(), Some("b"));
        assert!(s.redeem(&unused, HOME).is_err());
    }

    #[test]
    fn codes_and_sessions_are_bounded() {
        let s = Sessions::default();
        let first = s.new_code("t").unwrap();
        for _ in 0..MAX_CODES {
            s.new_code("t").unwrap();
        }
        assert_eq!(s.codes.lock().len(), MAX_CODES);
        assert!(s.redeem(&first, HOME).is_err(), "the oldest gave way");
        let mut ids = Vec::new();
        for _ in 0..MAX_SESSIONS + 3 {
            let code = s.new_code("t").unwrap();
            ids.push(s.redeem(&code, HOME).unwrap().id);
        }
        assert_eq!(s.count(), MAX_SESSIONS);
        assert!(s.lookup(ids.last().unwrap(), HOME).is_some());
    }
}
