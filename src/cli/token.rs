//! `ramd token create|list|revoke`: bearer tokens for the API over TCP
//! (`ramd daemon --api-listen ADDR`), and the global `--host`,
//! `--token-file` and `--ca-cert` that make any other command use one.
//!
//! Tokens are made and revoked through the daemon's unix socket only (the
//! daemon answers 403 `unix_socket_only` to a token caller), so run these
//! on the daemon's host as its user. The secret is printed once, alone on
//! stdout, so `ramd token create --admin --name ci > ci.token` keeps it
//! out of the terminal's scrollback.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::output::{render, table};
use super::{print_json, CliError, JsonFlag};
use crate::api::client::{Client, Host, Target};
use crate::api::wire::tokens::{CreateToken, TokenRole};

/// Where the token comes from when `--token-file` is not given.
pub const TOKEN_ENV: &str = "RAMD_TOKEN";

/// `ramd token ...`.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Make a token for the API over TCP and print it (only this once).
    ///
    /// Examples:
    ///   ramd token create --read-only --name grafana > grafana.token
    ///   ramd token create --admin --name ci > ci.token && chmod 600 ci.token
    ///   ramd --host https://db1:8443 --ca-cert ca.pem --token-file ci.token list
    ///
    /// Read-only tokens may GET every route (lists, stats, /metrics);
    /// admin tokens may call every route except token management.
    #[command(verbatim_doc_comment)]
    Create {
        /// GET routes only.
        #[arg(long, conflicts_with = "admin", required_unless_present = "admin")]
        read_only: bool,
        /// Every route (create, change and delete drives, ...).
        #[arg(long)]
        admin: bool,
        /// A name to list and revoke it by [default: its id].
        #[arg(long, value_parser = super::arg_name)]
        name: Option<String>,
        /// How long it works: 30d, 12h, 90m ... or never [default: never].
        /// An expired token gets 401 token_expired.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// List tokens: name, id, role, when made (never the secrets).
    List {
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Revoke a token: its next request gets 401.
    Revoke {
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
}

pub fn run(client: &Client, cmd: TokenCommand) -> Result<(), CliError> {
    match cmd {
        TokenCommand::Create {
            read_only,
            name,
            expires,
            out,
            ..
        } => {
            let role = if read_only {
                TokenRole::ReadOnly
            } else {
                TokenRole::Admin
            };
            let req = CreateToken {
                role,
                name,
                expires,
            };
            create(client, &req, out.json)
        }
        TokenCommand::List { out } => list(client, out.json),
        TokenCommand::Revoke { name, out } => {
            let r = client.revoke_token(&name)?;
            if out.json {
                return print_json(&r);
            }
            println!("token '{}' revoked", r.name);
            Ok(())
        }
    }
}

fn create(client: &Client, req: &CreateToken, json: bool) -> Result<(), CliError> {
    let t = client.create_token(req)?;
    if json {
        return print_json(&t);
    }
    println!("{}", t.token);
    eprintln!(
        "token '{}' ({}) created: it is shown only this once. Keep it in a file only you can read (chmod 600) and use it with --token-file FILE (or RAMD_TOKEN_FILE) and --host https://HOST:PORT",
        t.name,
        t.role.name()
    );
    Ok(())
}

fn list(client: &Client, json: bool) -> Result<(), CliError> {
    let list = client.tokens()?;
    if json {
        return print_json(&list);
    }
    let mut t = table(&["NAME", "ID", "ROLE", "CREATED", "EXPIRES"], &[]);
    let at = |s: u64| {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        humantime::format_rfc3339_seconds(t).to_string()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for tok in &list.tokens {
        let expires = match tok.expires_unix_s {
            None => "never".to_owned(),
            Some(s) if s <= now => format!("{} (expired)", at(s)),
            Some(s) => at(s),
        };
        t.add_row(vec![
            tok.name.clone(),
            tok.id.clone(),
            tok.role.name().to_owned(),
            at(tok.created_unix_s),
            expires,
        ]);
    }
    print!("{}", render(&t));
    Ok(())
}

/// Why `--host` and its token could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HostArgsError {
    #[error(transparent)]
    Host(#[from] crate::api::client::HostError),
    /// No token given for a `--host`.
    #[error("--host {0} needs a token: give --token-file FILE (or RAMD_TOKEN_FILE), or set RAMD_TOKEN; make one on the daemon's host with `ramd token create`")]
    NoToken(String),
    /// The token file could not be read or is empty.
    #[error("--token-file {}: {reason}", path.display())]
    TokenFile { path: PathBuf, reason: String },
}

/// The daemon a client command talks to: `--host` with its token and CA,
/// else the unix socket.
pub fn target(
    socket: PathBuf,
    host: Option<&str>,
    token_file: Option<&Path>,
    ca_cert: Option<&Path>,
) -> Result<Target, HostArgsError> {
    let Some(url) = host else {
        return Ok(Target::Unix(socket));
    };
    let token = match token_file {
        Some(path) => read_token(path)?,
        None => std::env::var(TOKEN_ENV)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| HostArgsError::NoToken(url.to_owned()))?,
    };
    Ok(Target::Host(Host::new(url, Some(token), ca_cert)?))
}

/// The token in `path` (surrounding whitespace dropped); warns when
/// others may read the file.
fn read_token(path: &Path) -> Result<String, HostArgsError> {
    let err = |reason: String| HostArgsError::TokenFile {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(err("expected one token (ramd_...) in the file".into()));
    }
    let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
    if mode & 0o077 != 0 {
        eprintln!(
            "warning: {} may be read by other users (mode {:04o}): chmod 600 it",
            path.display(),
            mode & 0o7777
        );
    }
    Ok(token.to_owned())
}
