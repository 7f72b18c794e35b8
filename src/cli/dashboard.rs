//! `ramd dashboard [--admin]`: a sign-in link to the daemon's web
//! dashboard (`ramd daemon --http ADDR`), printed as the last line of
//! stdout: `https://HOST:PORT/signin#CODE`. The code works once, for 5
//! minutes: opening the link starts a browser session (a cookie holding
//! a random session id, never the token) and the page drops the code from
//! the address bar.
//!
//! Each call makes a new token (`dashboard-<8 hex>`, read-only unless
//! `--admin`, working for `--expires`: 7 days by default) through the
//! unix socket (the daemon refuses token callers), so run it on the
//! daemon's host as its user; the session lasts as long as the token.
//! What the token is and how to end it goes to stderr, the URL alone to
//! stdout, so `url=$(ramd dashboard)` works.

use super::{print_json, CliError, JsonFlag};
use crate::api::client::Client;
use crate::api::wire::dashboard::CreateDashboardLink;
use crate::api::wire::tokens::TokenRole;

/// `ramd dashboard`.
#[derive(clap::Args, Debug)]
pub struct DashboardArgs {
    /// An admin link: the page may create, resize and delete drives, sync
    /// and snapshot [default: read-only, the page shows everything and
    /// changes nothing].
    #[arg(long)]
    pub admin: bool,

    /// The host name to put in the URL [default: the address of --http,
    /// or this machine's name when that is 0.0.0.0 or ::]. Under TLS the
    /// daemon's certificate must name it.
    #[arg(long, value_name = "NAME")]
    pub url_host: Option<String>,

    /// How long the session lasts (the link's token): 7d, 12h, 30m, or
    /// never. After that the page says the session expired (run ramd
    /// dashboard again), and the token is deleted the next time one is
    /// made or revoked. The link itself works once, within 5 minutes
    /// [default: 7d].
    #[arg(long, value_name = "DURATION|never", value_parser = arg_expires)]
    pub expires: Option<String>,

    #[command(flatten)]
    pub out: JsonFlag,
}

/// Why an `--expires` value cannot be used (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("'{text}': {why} (give a duration such as 7d, 12h or 30m, or never)")]
pub struct ExpiresError {
    text: String,
    why: String,
}

/// `--expires`: `never` or a duration of at least a second (the daemon
/// checks it again).
fn arg_expires(text: &str) -> Result<String, ExpiresError> {
    if text.trim().eq_ignore_ascii_case("never") {
        return Ok("never".into());
    }
    let why = match humantime::parse_duration(text) {
        Ok(d) if d.as_secs() >= 1 => return Ok(text.trim().to_owned()),
        Ok(_) => "a link must work for at least a second".to_owned(),
        Err(e) => e.to_string(),
    };
    Err(ExpiresError {
        text: text.to_owned(),
        why,
    })
}

pub fn run(client: &Client, args: DashboardArgs) -> Result<(), CliError> {
    let req = CreateDashboardLink {
        admin: args.admin,
        host: args.url_host,
        expires: args.expires,
    };
    let link = client.dashboard_link(&req)?;
    if args.out.json {
        return print_json(&link);
    }
    let can = match link.role {
        TokenRole::Admin => "see and change everything (create, resize and delete drives)",
        TokenRole::ReadOnly => "see everything (read-only)",
    };
    let until = match link.expires_unix_s {
        Some(s) => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
            format!("until {} (UTC) or", humantime::format_rfc3339_seconds(at))
        }
        None => "until".into(),
    };
    eprintln!(
        "a one-time sign-in link (it works once, within 5 minutes) for a new {} token '{}': the browser that opens it can {can} {until} `ramd token revoke {}`. Open it in a browser:",
        link.role.name(),
        link.token_name,
        link.token_name
    );
    println!("{}", link.url);
    Ok(())
}
