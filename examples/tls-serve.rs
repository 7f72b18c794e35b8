//! Serves one RAM drive over NBD on a unix socket and a TCP address, with
//! or without TLS, until killed: the NBD server without the daemon, for
//! bench/tls.sh (until the daemon has its `--tls` flags) and experiments.
//!
//!     cargo run --release --example tls-serve -- --socket /tmp/t.sock \
//!         --listen 127.0.0.1:10809 --size 1G \
//!         [--tls-certificates DIR] [--tls off|on|require] [--client-certs require|optional|off]

use std::path::PathBuf;
use std::sync::Arc;

use ramd::block::backend::Backend;
use ramd::nbd::tls::{ClientCerts, TlsMode, TlsSettings};
use ramd::nbd::{Export, ExportTable, Server, ServerConfig};
use ramd::size::parse as parse_size;
use ramd::store::{MemoryBudget, RamStore};

fn usage() -> ! {
    eprintln!(
        "usage: tls-serve --socket PATH --listen ADDR --size SIZE [--tls-certificates DIR] [--tls off|on|require] [--client-certs require|optional|off]"
    );
    std::process::exit(2)
}

fn main() {
    let mut socket = None;
    let mut listen = Vec::new();
    let mut size = None;
    let mut certs: Option<PathBuf> = None;
    let mut mode = None;
    let mut client_certs = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--socket" => socket = Some(PathBuf::from(value)),
            "--listen" => listen.push(value.parse().unwrap_or_else(|_| usage())),
            "--size" => size = Some(parse_size(&value).unwrap_or_else(|_| usage())),
            "--tls-certificates" => certs = Some(value.into()),
            "--tls" => mode = Some(value.parse::<TlsMode>().unwrap_or_else(|_| usage())),
            "--client-certs" => {
                client_certs = Some(match value.as_str() {
                    "require" => ClientCerts::Require,
                    "optional" => ClientCerts::Optional,
                    "off" => ClientCerts::Off,
                    _ => usage(),
                })
            }
            _ => usage(),
        }
    }
    let (Some(socket), Some(size)) = (socket, size) else {
        usage()
    };
    let store =
        RamStore::new(size, None, Arc::new(MemoryBudget::new(u64::MAX))).expect("create the drive");
    let exports = Arc::new(ExportTable::new());
    exports.insert(Arc::new(Export::new(
        "ram0",
        "tls-serve",
        Arc::new(store) as Arc<dyn Backend>,
        false,
    )));
    let mut config = ServerConfig::new(socket);
    config.tcp = listen;
    config.tls_mode = mode;
    if let Some(dir) = certs {
        config.tls = Some(TlsSettings::load(&dir, client_certs).unwrap_or_else(|e| {
            eprintln!("tls-serve: {e}");
            std::process::exit(1)
        }));
    }
    let server = Server::bind(config, exports).unwrap_or_else(|e| {
        eprintln!("tls-serve: {e}");
        std::process::exit(1)
    });
    server.run().expect("serve");
}
