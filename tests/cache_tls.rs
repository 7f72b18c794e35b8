//! Caches over NBD servers that speak TLS (issue 17, item 6): ramd as the
//! TLS client, with nbdkit (`--tls=require`, with and without
//! `--tls-verify-peer`) and qemu-nbd (`tls-creds-x509`) as the servers.
//!
//! - Data written through a cache over `nbds://` (TCP) and `nbds+unix://`
//!   reaches the server: read back over TLS by libnbd (nbdcopy, nbdsh),
//!   with mutual TLS (a client certificate) where the server asks for it.
//! - Each refusal is its own typed error with a message that says what to
//!   do: an untrusted CA, a certificate for another name, no client
//!   certificate for a server that verifies peers, a plaintext URI against
//!   a server that requires TLS, an `nbds` URI against a server without
//!   TLS; and the cache API passes the message on.
//!
//! The certificates (made with openssl, EC P-256, once per run):
//!
//! ```text
//! ca        signs: server (CN=localhost, SAN localhost + 127.0.0.1), client
//! rogue ca  signs nothing we use: a client trusting it must refuse the server
//! ```
//!
//! Client directories use libnbd's layout (`ca-cert.pem`, `client-cert.pem`,
//! `client-key.pem`), servers nbdkit's and qemu's. A missing nbdkit or
//! openssl fails (or skips with RAMD_SKIP_MISSING_TOOLS=1, see
//! `common::require`); qemu-nbd is optional and its test says when it
//! skips.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::pki::{issue, make_ca};
use common::{random_bytes, require, require_python_module, run, tool, wait_until, KillOnDrop};
use common::{Daemon, DAEMON_TIMEOUT, SKIP_ENV};
use ramd::block::backend::Backend;
use ramd::cache::backing::nbd_client::{ClientError, ClientOptions, NbdClient, NbdUri};
use ramd::cache::backing::{open_backing, BackingOptions};

const MIB: usize = 1 << 20;

// ------------------------------------------------------------ certificates

struct Pki {
    _root: tempfile::TempDir,
    /// nbdkit's and qemu's directory: ca-cert, server-cert, server-key.
    server: PathBuf,
    /// ca-cert.pem plus client-cert.pem and client-key.pem.
    client: PathBuf,
    /// ca-cert.pem only: no client certificate.
    anonymous: PathBuf,
    /// The rogue CA as ca-cert.pem: must not trust our server.
    distrustful: PathBuf,
}

/// True when openssl is installed (else fails, or skips with
/// RAMD_SKIP_MISSING_TOOLS=1).
#[track_caller]
fn require_pki_tools() -> bool {
    if !require(&["nbdkit"]) {
        return false;
    }
    if Command::new("openssl").arg("version").output().is_ok() {
        return true;
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: missing tool openssl ({SKIP_ENV}=1)");
        return false;
    }
    panic!("missing tool openssl: install with apt-get install openssl");
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(make_pki)
}

fn dir_with(path: &Path, files: &[(&Path, &str)]) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    for (from, name) in files {
        std::fs::copy(from, path.join(name)).unwrap();
    }
    path.to_owned()
}

fn make_pki() -> Pki {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let (ca, rogue) = (r.join("ca"), r.join("rogue-ca"));
    make_ca(&ca, "ramd cache test CA");
    make_ca(&rogue, "rogue CA");
    let (server_cert, server_key) = issue(&ca, "localhost", "server", None);
    let (client_cert, client_key) = issue(&ca, "ramd-cache", "client", None);
    let ca_cert = ca.join("ca-cert.pem");
    Pki {
        server: dir_with(
            &r.join("server"),
            &[
                (&ca_cert, "ca-cert.pem"),
                (&server_cert, "server-cert.pem"),
                (&server_key, "server-key.pem"),
            ],
        ),
        client: dir_with(
            &r.join("client"),
            &[
                (&ca_cert, "ca-cert.pem"),
                (&client_cert, "client-cert.pem"),
                (&client_key, "client-key.pem"),
            ],
        ),
        anonymous: dir_with(&r.join("anonymous"), &[(&ca_cert, "ca-cert.pem")]),
        distrustful: dir_with(
            &r.join("distrustful"),
            &[(&rogue.join("ca-cert.pem"), "ca-cert.pem")],
        ),
        _root: root,
    }
}

// ------------------------------------------------------------ servers

/// A free TCP port on 127.0.0.1 (free when asked; servers bind it soon).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where a test server listens.
enum Listen {
    Tcp(u16),
    Unix(PathBuf),
}

/// A TLS-speaking (or not) server, killed when dropped.
struct Server {
    _dir: tempfile::TempDir,
    listen: Listen,
    _child: KillOnDrop,
}

impl Server {
    /// `nbdkit memory 64M` with `tls` options, over TCP or a unix socket.
    #[track_caller]
    fn nbdkit(tcp: bool, tls: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let listen = if tcp {
            Listen::Tcp(free_port())
        } else {
            Listen::Unix(dir.path().join("nbdkit.sock"))
        };
        let mut cmd = tool("nbdkit");
        cmd.args(["-f", "--exit-with-parent"]);
        match &listen {
            Listen::Tcp(port) => cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()]),
            Listen::Unix(sock) => cmd.arg("-U").arg(sock),
        };
        cmd.args(tls).args(["memory", "64M"]);
        Server::spawn(dir, listen, cmd)
    }

    /// qemu-nbd over a 64 MiB raw file with TLS (verify-peer=on), TCP.
    #[track_caller]
    fn qemu_nbd() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.raw");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(64 * MIB as u64)
            .unwrap();
        let port = free_port();
        let mut cmd = tool("qemu-nbd");
        cmd.arg("--object")
            .arg(format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=server,verify-peer=on",
                pki().server.display()
            ))
            .args(["--tls-creds", "tls0", "-f", "raw", "-t", "-e", "8"])
            .args(["-b", "127.0.0.1"])
            .args(["-p", &port.to_string()])
            .arg(&image);
        Server::spawn(dir, Listen::Tcp(port), cmd)
    }

    #[track_caller]
    fn spawn(dir: tempfile::TempDir, listen: Listen, mut cmd: Command) -> Server {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the NBD server");
        let s = Server {
            _dir: dir,
            listen,
            _child: KillOnDrop(child),
        };
        wait_until("the NBD server to listen", DAEMON_TIMEOUT, || {
            match &s.listen {
                Listen::Tcp(port) => std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok(),
                // The file exists from bind(); only a connect says listen()
                // happened (a loaded run refused one in between).
                Listen::Unix(sock) => std::os::unix::net::UnixStream::connect(sock).is_ok(),
            }
        });
        s
    }

    /// The server's URI: `nbds` with `query` when `tls`, `host` for TCP.
    fn uri(&self, tls: bool, host: &str, query: &str) -> String {
        let s = if tls { "s" } else { "" };
        match &self.listen {
            Listen::Tcp(port) => {
                let q = if query.is_empty() { "" } else { "?" };
                format!("nbd{s}://{host}:{port}/{q}{query}")
            }
            Listen::Unix(sock) => {
                let amp = if query.is_empty() { "" } else { "&" };
                format!("nbd{s}+unix:///?socket={}{amp}{query}", sock.display())
            }
        }
    }
}

fn certs(dir: &Path) -> String {
    format!("tls-certificates={}", dir.display())
}

fn connect(uri: &str) -> Result<NbdClient, ClientError> {
    NbdClient::connect(&NbdUri::parse(uri).unwrap(), ClientOptions::default())
}

/// `len` bytes at `offset`, read by libnbd (nbdcopy) from `uri`.
fn nbdcopy_read(uri: &str, offset: usize, len: usize) -> Vec<u8> {
    let out = tempfile::NamedTempFile::new().unwrap();
    run(tool("nbdcopy").arg(uri).arg(out.path())).ok();
    std::fs::read(out.path()).unwrap()[offset..offset + len].to_vec()
}

/// `len` bytes at `offset`, read by nbdsh from `uri`.
fn nbdsh_read(uri: &str, offset: usize, len: usize) -> Vec<u8> {
    let out = tempfile::NamedTempFile::new().unwrap();
    // libnbd refuses tls-certificates in a URI unless told local files
    // are fine (nbdsh -u does not say so).
    let script = format!(
        "h.set_uri_allow_local_file(True)\nh.connect_uri({uri:?})\n\
         open({:?},'wb').write(h.pread({len},{offset}))",
        out.path().display().to_string()
    );
    run(tool("nbdsh").args(["-c", &script])).ok();
    std::fs::read(out.path()).unwrap()
}

// ------------------------------------------------------------ tests

/// The client alone over nbdkit with mTLS, over TCP and a unix socket:
/// what it writes, libnbd reads back over TLS.
#[test]
fn the_nbd_client_writes_over_mutual_tls_to_nbdkit() {
    if !require_pki_tools() || !require(&["nbdcopy", "nbdsh"]) {
        return;
    }
    let p = pki();
    let server_dir = format!("--tls-certificates={}", p.server.display());
    for tcp in [true, false] {
        let kit = Server::nbdkit(tcp, &["--tls=require", &server_dir, "--tls-verify-peer"]);
        let uri = kit.uri(true, "localhost", &certs(&p.client));
        let client = connect(&uri).unwrap_or_else(|e| panic!("{uri}: {e}"));
        assert_eq!(client.size(), 64 << 20);
        let data = random_bytes(3 * MIB + 4096, tcp as u64);
        client.write(MIB as u64, &data, true).unwrap();
        let pieces: Vec<(u64, &[u8])> = (0..8).map(|i| (i * 8192, &data[..4096])).collect();
        client.write_many(&pieces).unwrap();
        client.flush().unwrap();
        let mut back = vec![0u8; data.len()];
        client.read(MIB as u64, &mut back).unwrap();
        assert!(back == data, "{uri}: read back differs");
        drop(client);
        let libnbd = if tcp {
            nbdcopy_read(&uri, MIB, data.len())
        } else {
            nbdsh_read(&uri, MIB, data.len())
        };
        assert!(libnbd == data, "{uri}: libnbd reads other data");
        assert!(nbdsh_read(&uri, 8192, 4096) == data[..4096]);
    }
}

/// Each refusal is its own error, and says what to do.
#[test]
fn refusals_are_typed_and_say_what_to_do() {
    if !require_pki_tools() {
        return;
    }
    let p = pki();
    let server_dir = format!("--tls-certificates={}", p.server.display());
    let verifying = Server::nbdkit(true, &["--tls=require", &server_dir, "--tls-verify-peer"]);
    let open = Server::nbdkit(false, &["--tls=require", &server_dir]);
    let plain = Server::nbdkit(false, &[]);

    let e = connect(&verifying.uri(true, "127.0.0.1", &certs(&p.distrustful))).unwrap_err();
    assert!(
        matches!(e, ClientError::CertificateNotTrusted { .. }),
        "{e}"
    );
    let m = e.to_string();
    assert!(
        m.contains("not trusted") && m.contains("ca-cert.pem"),
        "{m}"
    );

    let uri = verifying.uri(
        true,
        "127.0.0.1",
        &format!("{}&tls-hostname=storage.example", certs(&p.client)),
    );
    let e = connect(&uri).unwrap_err();
    assert!(matches!(e, ClientError::WrongHostName { .. }), "{e}");
    assert!(e.to_string().contains("'storage.example'"), "{e}");

    let e = connect(&verifying.uri(true, "localhost", &certs(&p.anonymous))).unwrap_err();
    assert!(
        matches!(e, ClientError::ClientCertificateRefused { .. }),
        "{e}"
    );
    let m = e.to_string();
    assert!(
        m.contains("client-cert.pem") && m.contains("no client certificate"),
        "{m}"
    );

    let e = connect(&open.uri(false, "", "")).unwrap_err();
    assert!(matches!(e, ClientError::TlsRequired { .. }), "{e}");
    assert!(e.to_string().contains("use nbds://"), "{e}");

    let e = connect(&plain.uri(true, "", &certs(&p.client))).unwrap_err();
    assert!(matches!(e, ClientError::TlsUnsupported { .. }), "{e}");
    assert!(e.to_string().contains("--tls=require"), "{e}");

    // The server's CA is enough when it does not verify peers; and no
    // check at all with tls-verify-peer=false (warned in the log).
    connect(&open.uri(true, "", &certs(&p.anonymous))).unwrap();
    connect(&open.uri(true, "", "tls-verify-peer=false")).unwrap();
    let e = connect(&open.uri(true, "", &certs(&p.distrustful))).unwrap_err();
    assert!(
        matches!(e, ClientError::CertificateNotTrusted { .. }),
        "{e}"
    );

    // open_backing (what `ramd cache create` calls) keeps the message.
    let e = open_backing(
        &verifying.uri(true, "localhost", &certs(&p.distrustful)),
        &BackingOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("not trusted"), "{e}");
}

/// The daemon: caches over nbdkit through nbds:// (TCP) and nbds+unix://
/// with mTLS, written through ramd's export, synced, and read back from
/// nbdkit over TLS; refused backings give the client's message in the API.
#[test]
fn daemon_caches_over_nbds_reach_nbdkit_and_refusals_reach_the_api() {
    if !require_pki_tools()
        || !require(&["nbdsh"])
        || !require_python_module("nbd", "python3-libnbd")
    {
        return;
    }
    let p = pki();
    let server_dir = format!("--tls-certificates={}", p.server.display());
    let d = Daemon::launch(&["daemon".into(), "--no-default-drive".into()], &[]);
    for (i, tcp) in [true, false].into_iter().enumerate() {
        let kit = Server::nbdkit(tcp, &["--tls=require", &server_dir, "--tls-verify-peer"]);
        let backing = kit.uri(true, "localhost", &certs(&p.client));
        let name = format!("tls{i}");
        run(d
            .cli()
            .args(["cache", "create", &name, "--backing", &backing])
            .args(["--size", "8M", "--mode", "writeback"]))
        .ok();
        let data = random_bytes(2 * MIB, 40 + i as u64);
        write_through(&d.uri(&name), 4096, &data);
        run(d.cli().args(["sync", &name])).ok();
        assert!(
            nbdsh_read(&backing, 4096, data.len()) == data,
            "{backing}: nbdkit does not hold what was written through the cache"
        );
        run(d.cli().args(["cache", "delete", &name])).ok();
    }
    // No server check: it works, and the daemon warns.
    let kit = Server::nbdkit(false, &["--tls=require", &server_dir]);
    let backing = kit.uri(true, "", "tls-verify-peer=false");
    run(d
        .cli()
        .args(["cache", "create", "unchecked", "--backing", &backing])
        .args(["--size", "8M", "--mode", "writethrough"]))
    .ok();
    d.wait_log("the warning about tls-verify-peer=false", |log| {
        log.contains("WARN") && log.contains("tls-verify-peer=false")
    });
    run(d.cli().args(["cache", "delete", "unchecked"])).ok();
    drop(kit);
    let kit = Server::nbdkit(false, &["--tls=require", &server_dir, "--tls-verify-peer"]);
    for (backing, says) in [
        (kit.uri(true, "", &certs(&p.distrustful)), "not trusted"),
        (
            kit.uri(true, "", &certs(&p.anonymous)),
            "client certificate",
        ),
        (kit.uri(false, "", ""), "requires TLS"),
        (
            format!("nbds://localhost:1/?{}", certs(&p.client)),
            "cannot connect",
        ),
    ] {
        let out = run(d
            .cli()
            .args(["cache", "create", "refused", "--backing", &backing])
            .args(["--size", "8M", "--mode", "writethrough"]))
        .failed();
        assert!(out.stderr.contains(says), "{backing}: {out}");
    }
}

/// qemu-nbd with tls-creds-x509 (verify-peer=on) as the server.
#[test]
fn the_nbd_client_speaks_tls_to_qemu_nbd() {
    if !require_pki_tools() {
        return;
    }
    if !Command::new("qemu-nbd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("SKIPPED: qemu-nbd is not installed (apt-get install qemu-utils)");
        return;
    }
    let p = pki();
    let q = Server::qemu_nbd();
    let uri = q.uri(true, "localhost", &certs(&p.client));
    let client = connect(&uri).unwrap_or_else(|e| panic!("{uri}: {e}"));
    let data = random_bytes(MIB, 7);
    client.write(0, &data, false).unwrap();
    client.flush().unwrap();
    drop(client);
    let client = connect(&uri).unwrap();
    let mut back = vec![0u8; MIB];
    client.read(0, &mut back).unwrap();
    assert!(back == data, "qemu-nbd holds other data");
    let e = connect(&q.uri(true, "localhost", &certs(&p.anonymous))).unwrap_err();
    assert!(
        matches!(e, ClientError::ClientCertificateRefused { .. }),
        "{e}"
    );
}

/// Writes `data` at `offset` through libnbd and flushes.
fn write_through(uri: &str, offset: u64, data: &[u8]) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), data).unwrap();
    common::python(
        "import nbd,sys\nh=nbd.NBD()\nh.connect_uri(sys.argv[1])\n\
         h.pwrite(open(sys.argv[2],'rb').read(), int(sys.argv[3]))\nh.flush()\nh.shutdown()\n",
        &[uri, f.path().to_str().unwrap(), &offset.to_string()],
    )
    .ok();
}
