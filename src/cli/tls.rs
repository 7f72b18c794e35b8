//! `ramd tls reload`: the NBD server reads its certificates directory
//! again (as SIGHUP does). New connections use the new certificates;
//! running ones keep theirs; a directory that does not load changes
//! nothing and the command fails with the daemon's reason.

use super::{print_json, CliError, JsonFlag};
use crate::api::client::Client;

/// `ramd tls ...`.
#[derive(clap::Subcommand, Debug)]
pub enum TlsCommand {
    /// Read the certificates directory (--tls-certificates) again, without
    /// dropping connections: new ones use the new certificates.
    ///
    /// Same as `kill -HUP $(pidof ramd)`, but says whether it worked: a
    /// directory that does not load keeps the certificates in use, and
    /// this command prints why and exits 1.
    #[command(verbatim_doc_comment)]
    Reload {
        #[command(flatten)]
        out: JsonFlag,
    },
}

pub fn run(client: &Client, cmd: TlsCommand) -> Result<(), CliError> {
    match cmd {
        TlsCommand::Reload { out } => {
            let r = client.reload_tls()?;
            if out.json {
                return print_json(&r);
            }
            println!(
                "TLS certificates reloaded from {} (client certificates: {}); new connections use them",
                r.certificates_dir, r.client_certificates
            );
            Ok(())
        }
    }
}
