//! `ramd remote add|list|remove`: the object-storage places drive
//! snapshots go (thin client of /v1/remotes). No secret ever crosses the
//! API: a remote names a credentials file (mode 0600) or uses the
//! daemon's environment.

use clap::Subcommand;

use super::output::{render, table};
use super::{absolute_text, print_json, CliError, JsonFlag};
use crate::api::client::Client;
use crate::api::wire::snapshots::AddRemote;
use crate::api::wire::values::SizeValue;
use crate::size::format_size;

/// `ramd remote ...`
#[derive(Subcommand, Debug)]
pub enum RemoteCommand {
    /// Add a remote (kept in the daemon's state directory, mode 0600).
    ///
    /// Examples:
    ///   ramd remote add s3 s3://backups/ramd --endpoint http://127.0.0.1:3900 \
    ///       --region garage --credentials-file /etc/ramd/s3.toml
    ///   ramd remote add aws s3://my-bucket/hosts/db1 --region eu-west-1
    ///
    /// The credentials file is TOML with access_key_id and
    /// secret_access_key, readable by its owner only; without one the
    /// daemon uses AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY from its
    /// environment. Nothing is checked against the server until a push.
    #[command(verbatim_doc_comment)]
    Add {
        /// Remote name: 1-64 of a-z 0-9 _ -.
        name: String,
        /// s3://BUCKET[/PREFIX]
        url: String,
        /// An S3-compatible server, e.g. http://127.0.0.1:3900 [default: AWS].
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// The S3 region [default: the credentials', else us-east-1].
        #[arg(long, value_name = "REGION")]
        region: Option<String>,
        /// TOML file (0600) with access_key_id and secret_access_key.
        #[arg(long, value_name = "FILE")]
        credentials_file: Option<std::path::PathBuf>,
        /// The snapshot key for `--encrypt` (32 bytes or 64 hex digits, 0600).
        #[arg(long, value_name = "FILE")]
        encrypt_key_file: Option<std::path::PathBuf>,
        /// Chunk size of pushes: a power of two from 64K to 64M. Smaller
        /// chunks send less after scattered small writes, larger ones
        /// make fewer objects (docs/snapshots.md) [default: 256K].
        #[arg(long, value_name = "SIZE")]
        chunk_size: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// List remotes: URL, endpoint, where the credentials come from.
    List {
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Remove a remote added with `ramd remote add` (its snapshots stay in
    /// the bucket).
    Remove {
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },
}

pub fn run(client: &Client, cmd: RemoteCommand) -> Result<(), CliError> {
    match cmd {
        RemoteCommand::Add {
            name,
            url,
            endpoint,
            region,
            credentials_file,
            encrypt_key_file,
            chunk_size,
            out,
        } => {
            let req = AddRemote {
                name,
                url,
                endpoint,
                region,
                credentials_file: absolute_text(credentials_file.as_deref())?,
                encrypt_key_file: absolute_text(encrypt_key_file.as_deref())?,
                chunk_size: chunk_size.map(SizeValue::Text),
            };
            let r = client.add_remote(&req)?;
            if out.json {
                return print_json(&r);
            }
            println!(
                "remote '{}' added: {} (credentials: {})",
                r.name, r.url, r.credentials
            );
        }
        RemoteCommand::List { out } => {
            let l = client.list_remotes()?;
            if out.json {
                return print_json(&l);
            }
            let mut t = table(
                &[
                    "NAME",
                    "URL",
                    "ENDPOINT",
                    "CREDENTIALS",
                    "KEY",
                    "CHUNK",
                    "FROM",
                ],
                &[],
            );
            for r in &l.remotes {
                t.add_row(vec![
                    r.name.clone(),
                    r.url.clone(),
                    r.endpoint.clone().unwrap_or_else(|| "AWS".into()),
                    r.credentials.clone(),
                    r.encrypt_key_file.clone().unwrap_or_else(|| "-".into()),
                    format_size(r.chunk_bytes),
                    r.origin.clone(),
                ]);
            }
            print!("{}", render(&t));
        }
        RemoteCommand::Remove { name, out } => {
            let r = client.remove_remote(&name)?;
            if out.json {
                return print_json(&r);
            }
            println!(
                "remote '{}' removed (its snapshots stay in the bucket)",
                r.name
            );
        }
    }
    Ok(())
}
