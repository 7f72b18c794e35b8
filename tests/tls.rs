//! NBD over TLS (issue 17): an in-process `Server` with certificates made
//! by the test with `openssl`, driven by real clients (nbdinfo, nbdsh,
//! nbdcopy, qemu-img, fio) over `nbds://` and `nbds+unix://`, and by a raw
//! plaintext client for what `require` mode must refuse.
//!
//! The certificates (one CA per run, EC P-256 keys, made in a second):
//!
//! ```text
//! ca          signs: server (CN=localhost, SAN localhost + 127.0.0.1),
//!             client-a, expired (valid Jan 2020 only), revoked (in ca-crl.pem)
//! rogue ca    signs: rogue (a client cert the server must not trust),
//!             and a server cert for the reload test
//! ```
//!
//! Client directories use libnbd's and qemu's layout (`ca-cert.pem`,
//! `client-cert.pem`, `client-key.pem`). A missing tool fails its test;
//! RAMD_SKIP_MISSING_TOOLS=1 skips instead (see `common::require`).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::nbdserver::{Drive, TestServer};
use common::pki::{issue, make_ca, openssl};
use common::pysession::PySession;
use common::{random_bytes, require, run, tool, SKIP_ENV};
use ramd::nbd::proto::*;
use ramd::nbd::server::{TlsConfigError, TlsSetupError};
use ramd::nbd::tls::{ClientCerts, TlsMode, TlsSettings};
use ramd::nbd::ServerConfig;

const MIB: usize = 1 << 20;
const DRIVE_BYTES: u64 = 64 << 20;

// ------------------------------------------------------------ certificates

/// True when openssl is installed; otherwise fails the test, or skips it
/// with RAMD_SKIP_MISSING_TOOLS=1 (like `common::require`).
#[track_caller]
fn require_openssl() -> bool {
    if Command::new("openssl").arg("version").output().is_ok() {
        return true;
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: missing tool openssl ({SKIP_ENV}=1)");
        return false;
    }
    panic!(
        "missing tool openssl: install with apt-get install openssl (or run scripts/test-deps.sh)"
    );
}

/// Every directory the tests use, made once per test binary.
struct Pki {
    _root: tempfile::TempDir,
    /// The server's directory: ca-cert, server-cert, server-key, ca-crl.
    server: PathBuf,
    /// The same CA and key, but a server certificate from the rogue CA.
    server_rogue: PathBuf,
    /// Client directories.
    good: PathBuf,
    anonymous: PathBuf,
    rogue: PathBuf,
    expired: PathBuf,
    revoked: PathBuf,
    /// Trusts only the rogue CA: must not accept our server.
    distrustful: PathBuf,
    /// Trusts only the rogue CA, holds a client cert from it: for the
    /// server after reload to `server_rogue`.
    rogue_trusting: PathBuf,
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(make_pki)
}

/// A client directory: `ca` as ca-cert.pem, and the client's pair if any.
fn client_dir(path: &Path, ca: &Path, pair: Option<&(PathBuf, PathBuf)>) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), path.join("ca-cert.pem")).unwrap();
    if let Some((cert, key)) = pair {
        std::fs::copy(cert, path.join("client-cert.pem")).unwrap();
        std::fs::copy(key, path.join("client-key.pem")).unwrap();
    }
    path.to_owned()
}

fn server_dir(path: &Path, ca: &Path, client_ca: &Path, pair: &(PathBuf, PathBuf)) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::copy(client_ca.join("ca-cert.pem"), path.join("ca-cert.pem")).unwrap();
    std::fs::copy(&pair.0, path.join("server-cert.pem")).unwrap();
    std::fs::copy(&pair.1, path.join("server-key.pem")).unwrap();
    if ca.join("ca-crl.pem").exists() {
        std::fs::copy(ca.join("ca-crl.pem"), path.join("ca-crl.pem")).unwrap();
    }
    path.to_owned()
}

fn make_pki() -> Pki {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let (ca, rogue_ca) = (r.join("ca"), r.join("rogue-ca"));
    make_ca(&ca, "ramd test CA");
    make_ca(&rogue_ca, "rogue CA");
    let server = issue(&ca, "localhost", "server", None);
    let good = issue(&ca, "client-a", "client", None);
    let expired = issue(
        &ca,
        "expired",
        "client",
        Some(("20200101000000Z", "20200201000000Z")),
    );
    let revoked = issue(&ca, "revoked", "client", None);
    openssl(
        &ca,
        &[
            "ca",
            "-config",
            "ca.cnf",
            "-cert",
            "ca-cert.pem",
            "-keyfile",
            "ca-key.pem",
            "-revoke",
            revoked.0.to_str().unwrap(),
        ],
    );
    openssl(
        &ca,
        &[
            "ca",
            "-gencrl",
            "-config",
            "ca.cnf",
            "-cert",
            "ca-cert.pem",
            "-keyfile",
            "ca-key.pem",
            "-out",
            "ca-crl.pem",
        ],
    );
    let rogue = issue(&rogue_ca, "rogue", "client", None);
    let rogue_server = issue(&rogue_ca, "localhost", "server", None);
    Pki {
        server: server_dir(&r.join("server"), &ca, &ca, &server),
        server_rogue: server_dir(&r.join("server-rogue"), &rogue_ca, &rogue_ca, &rogue_server),
        good: client_dir(&r.join("good"), &ca, Some(&good)),
        anonymous: client_dir(&r.join("anonymous"), &ca, None),
        rogue: client_dir(&r.join("rogue"), &ca, Some(&rogue)),
        expired: client_dir(&r.join("expired"), &ca, Some(&expired)),
        revoked: client_dir(&r.join("revoked"), &ca, Some(&revoked)),
        distrustful: client_dir(&r.join("distrustful"), &rogue_ca, Some(&good)),
        rogue_trusting: client_dir(&r.join("rogue-trusting"), &rogue_ca, Some(&rogue)),
        _root: root,
    }
}

// ------------------------------------------------------------------ server

/// An in-process server (`common::nbdserver`) exporting `ram0` on a unix
/// socket and loopback TCP.
fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let ram0 = Drive::new("ram0", DRIVE_BYTES).described("tls test drive");
    TestServer::start(&[ram0], |c| {
        c.tcp = vec!["127.0.0.1:0".parse().unwrap()];
        tweak(c)
    })
}

/// Certificates from `dir`, TCP in `mode`, client certificates as
/// `client_certs` (None: the default).
fn with_tls(
    dir: &Path,
    mode: TlsMode,
    client_certs: Option<ClientCerts>,
) -> (TestServer, Arc<TlsSettings>) {
    let settings = TlsSettings::load(dir, client_certs).expect("load certificates");
    let s = settings.clone();
    let server = start(|c| {
        c.tls = Some(s);
        c.tls_mode = Some(mode);
    });
    (server, settings)
}

/// The URIs of a test server.
trait Uris {
    fn tcp_uri(&self, tls: bool, certs: Option<&Path>) -> String;
    fn unix_uri(&self, certs: &Path) -> String;
}

impl Uris for TestServer {
    fn tcp_uri(&self, tls: bool, certs: Option<&Path>) -> String {
        let scheme = if tls { "nbds" } else { "nbd" };
        let mut uri = format!("{scheme}://127.0.0.1:{}/ram0", self.tcp[0].port());
        if let Some(dir) = certs {
            uri += &format!("?tls-certificates={}", dir.display());
        }
        uri
    }

    fn unix_uri(&self, certs: &Path) -> String {
        format!(
            "nbds+unix:///ram0?socket={}&tls-certificates={}",
            self.socket.display(),
            certs.display()
        )
    }
}

/// The size nbdinfo reports for `uri`, or its failure output.
fn nbdinfo_size(uri: &str) -> Result<u64, String> {
    let out = run(tool("nbdinfo").args(["--size", uri]));
    if !out.status.success() {
        return Err(out.to_string());
    }
    Ok(out.stdout.trim().parse().expect("a size"))
}

// ------------------------------------------------------------ real clients

#[test]
fn nbdinfo_over_tcp_and_unix_with_client_certificates() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let p = pki();
    let (server, settings) = with_tls(&p.server, TlsMode::Require, None);
    assert_eq!(
        settings.client_certs(),
        ClientCerts::Require,
        "a CA means required"
    );
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.good))),
        Ok(DRIVE_BYTES)
    );
    assert_eq!(nbdinfo_size(&server.unix_uri(&p.good)), Ok(DRIVE_BYTES));
    // The unix socket defaults to `on`: plaintext works there too.
    let plain_unix = format!("nbd+unix:///ram0?socket={}", server.socket.display());
    assert_eq!(nbdinfo_size(&plain_unix), Ok(DRIVE_BYTES));
    let out = run(tool("nbdinfo").args(["--list", &server.tcp_uri(true, Some(&p.good))]));
    assert!(out.status.success() && out.stdout.contains("ram0"), "{out}");
}

#[test]
fn require_mode_refuses_plaintext_clients_without_listing_exports() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::Require, None);
    let out = run(tool("nbdinfo").args(["--list", &server.tcp_uri(false, None)]));
    assert!(!out.status.success(), "{out}");
    assert!(
        !out.stdout.contains("ram0") && !out.stderr.contains("ram0"),
        "{out}"
    );
    assert!(nbdinfo_size(&server.tcp_uri(false, None)).is_err());

    // The same, byte by byte: every option but STARTTLS and ABORT gets
    // TLS_REQD (no export names in the replies), EXPORT_NAME hangs up.
    let mut c = RawClient::connect(server.tcp[0]);
    for (option, data) in [
        (OPT_LIST, Vec::new()),
        (OPT_GO, encode_info_request("ram0", &[])),
        (OPT_INFO, encode_info_request("ram0", &[])),
        (OPT_STRUCTURED_REPLY, Vec::new()),
        (OPT_LIST_META_CONTEXT, Vec::new()),
        (99, Vec::new()),
    ] {
        let (reply, message) = c.option(option, &data);
        assert_eq!(reply, REP_ERR_TLS_REQD, "option {option}: {message}");
        assert!(!message.contains("ram0"), "{message}");
    }
    c.send_option(OPT_EXPORT_NAME, b"ram0");
    assert!(c.closed(), "EXPORT_NAME before TLS must end the connection");
}

#[test]
fn on_mode_serves_plaintext_and_tls() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::On, None);
    assert_eq!(nbdinfo_size(&server.tcp_uri(false, None)), Ok(DRIVE_BYTES));
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.good))),
        Ok(DRIVE_BYTES)
    );
    // A second STARTTLS over TLS is invalid; without certificates at all
    // STARTTLS is unsupported (tests/protocol.rs); with mode off, policy.
    let (off, _) = with_tls(&p.server, TlsMode::Off, None);
    let mut c = RawClient::connect(off.tcp[0]);
    assert_eq!(c.option(OPT_STARTTLS, &[]).0, REP_ERR_POLICY);
    let (_, listing) = c.option(OPT_LIST, &[]);
    assert!(
        listing.contains("ram0"),
        "plaintext listing works in mode off"
    );
}

#[test]
fn refused_client_certificates() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::Require, None);
    for (what, dir) in [
        ("no client certificate", &p.anonymous),
        ("a certificate from another CA", &p.rogue),
        ("an expired certificate", &p.expired),
        ("a revoked certificate", &p.revoked),
        (
            "a client that does not trust the server's CA",
            &p.distrustful,
        ),
    ] {
        let got = nbdinfo_size(&server.tcp_uri(true, Some(dir)));
        assert!(got.is_err(), "{what} was served: {got:?}");
    }
    // The server is still fine after all those.
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.good))),
        Ok(DRIVE_BYTES)
    );
}

#[test]
fn optional_client_certificates_serve_anonymous_clients() {
    if !require_openssl() || !require(&["nbdinfo"]) {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::Require, Some(ClientCerts::Optional));
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.anonymous))),
        Ok(DRIVE_BYTES)
    );
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.good))),
        Ok(DRIVE_BYTES)
    );
    // A certificate that is shown must still be valid. (A certificate
    // from another CA is not shown at all: GnuTLS offers only one that
    // matches the CAs the server names, so that client is anonymous.)
    assert!(nbdinfo_size(&server.tcp_uri(true, Some(&p.expired))).is_err());
    assert!(nbdinfo_size(&server.tcp_uri(true, Some(&p.revoked))).is_err());
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.rogue))),
        Ok(DRIVE_BYTES)
    );
}

/// nbdcopy in and out over nbds://, nbdsh over nbds+unix://, and qemu-img
/// convert and compare with tls-creds-x509: the bytes survive the trip.
#[test]
fn nbdcopy_nbdsh_and_qemu_img_round_trip() {
    if !require_openssl() || !require(&["nbdcopy", "nbdsh", "qemu-img"]) {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::Require, None);
    let tmp = tempfile::tempdir().unwrap();
    let data = random_bytes(8 * MIB, 17);
    let src = tmp.path().join("src.img");
    std::fs::write(&src, &data).unwrap();
    let uri = server.tcp_uri(true, Some(&p.good));

    let out = run(tool("nbdcopy").args([src.to_str().unwrap(), &uri]));
    assert!(out.status.success(), "{out}");
    let back = tmp.path().join("back.img");
    let out = run(tool("nbdcopy").args([&uri, back.to_str().unwrap()]));
    assert!(out.status.success(), "{out}");
    assert!(
        std::fs::read(&back).unwrap()[..data.len()] == data[..],
        "nbdcopy round trip"
    );

    // nbdsh and fio (libnbd's nbd_connect_uri without
    // nbd_set_uri_allow_local_file) refuse tls-certificates= in a URI: the
    // script allows it, fio finds the files in $HOME/.pki/libnbd.
    let script = format!(
        "h.set_uri_allow_local_file(True)\n\
         h.connect_uri('{}')\n\
         assert h.get_size() == {DRIVE_BYTES}\n\
         assert h.pread(4096, 4096) == open('{}', 'rb').read()[4096:8192]\n\
         h.pwrite(b'\\x5a' * 65536, {})\n\
         print('nbdsh ok')",
        server.unix_uri(&p.good),
        src.display(),
        DRIVE_BYTES - 65536
    );
    let out = run(tool("nbdsh").args(["-c", &script]));
    assert!(
        out.status.success() && out.stdout.contains("nbdsh ok"),
        "{out}"
    );

    let qemu_src = tmp.path().join("qemu.img");
    std::fs::write(&qemu_src, random_bytes(4 * MIB, 18)).unwrap();
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        p.good.display()
    );
    let target = format!(
        "driver=nbd,host=127.0.0.1,port={},export=ram0,tls-creds=tls0",
        server.tcp[0].port()
    );
    let out = run(tool("qemu-img").args([
        "convert",
        "-n",
        "-f",
        "raw",
        "--object",
        &object,
        "--target-image-opts",
        qemu_src.to_str().unwrap(),
        &target,
    ]));
    assert!(out.status.success(), "{out}");
    // compare checks the image's length of the drive: pad the file.
    let mut padded = std::fs::read(&qemu_src).unwrap();
    padded.resize(DRIVE_BYTES as usize, 0);
    let tail = DRIVE_BYTES as usize - 65536;
    padded[tail..].fill(0x5a);
    // Bytes 4..8 MiB were written by nbdcopy, not qemu-img.
    padded[4 * MIB..8 * MIB].copy_from_slice(&data[4 * MIB..8 * MIB]);
    std::fs::write(&qemu_src, &padded).unwrap();
    let out = run(tool("qemu-img").args([
        "compare",
        "--object",
        &object,
        "--image-opts",
        &format!(
            "driver=raw,file.driver=file,file.filename={}",
            qemu_src.display()
        ),
        &target,
    ]));
    assert!(out.status.success(), "qemu-img compare: {out}");
}

#[test]
fn fio_over_nbds() {
    if !require_openssl() || !require(&["fio"]) {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::Require, None);
    // fio takes only a URI and libnbd refuses tls-certificates= there
    // (no nbd_set_uri_allow_local_file), so fio finds the client's files
    // in $HOME/.pki/libnbd: libnbd's default for any user but root (root's
    // is /etc/pki/libnbd), so as root fio runs as nobody.
    let home = tempfile::tempdir().unwrap();
    let pki_dir = home.path().join(".pki/libnbd");
    copy_dir(&p.good, &pki_dir);
    let mut fio = tool("fio");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        let open = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        for dir in [home.path(), &home.path().join(".pki"), &pki_dir] {
            open(dir, 0o755);
        }
        for file in std::fs::read_dir(&pki_dir).unwrap() {
            open(&file.unwrap().path(), 0o644);
        }
        fio = tool("setpriv");
        fio.args(["--reuid=65534", "--regid=65534", "--clear-groups", "fio"]);
    }
    let uri = server.tcp_uri(true, None);
    let out = run(fio.env("HOME", home.path()).current_dir(home.path()).args([
        "--name=tls",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=16",
        "--size=16m",
        "--io_size=32m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--numjobs=1",
    ]));
    assert!(out.status.success(), "{out}");
    assert!(!out.stdout.contains("verify: bad"), "{out}");
}

/// A reload swaps certificates for new connections; a session that was
/// running keeps working.
#[test]
fn reload_swaps_certificates_without_dropping_sessions() {
    if !require_openssl() || !require_python_nbd() {
        return;
    }
    let p = pki();
    let tmp = tempfile::tempdir().unwrap();
    let live_dir = tmp.path().join("certs");
    copy_dir(&p.server, &live_dir);
    let (server, settings) = with_tls(&live_dir, TlsMode::Require, None);
    let mut session = PySession::open(&server.tcp_uri(true, Some(&p.good)));
    assert!(session.round_trip());
    assert!(server
        .shutdown
        .tls_identities()
        .contains(&"client-a".to_owned()));

    // A broken directory is refused and changes nothing.
    std::fs::write(live_dir.join("server-key.pem"), "not a key").unwrap();
    assert!(settings.reload().is_err());
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.good))),
        Ok(DRIVE_BYTES)
    );

    copy_dir(&p.server_rogue, &live_dir);
    std::fs::remove_file(live_dir.join("ca-crl.pem")).ok();
    settings.reload().expect("reload");
    assert!(nbdinfo_size(&server.tcp_uri(true, Some(&p.good))).is_err());
    assert_eq!(
        nbdinfo_size(&server.tcp_uri(true, Some(&p.rogue_trusting))),
        Ok(DRIVE_BYTES)
    );
    assert!(
        session.round_trip(),
        "the running session survived the reload"
    );
    // Shutdown ends a live TLS session too (the server's run() returns,
    // checked when the server drops) and the client sees it end.
    drop(server);
    assert!(!session.round_trip(), "the session ended with the server");
}

/// STARTTLS byte by byte: what was negotiated before TLS is forgotten, a
/// second STARTTLS is invalid, the identity is recorded, and the whole
/// handshake and a read and write then run over TLS.
#[test]
fn starttls_upgrade_forgets_plaintext_state() {
    if !require_openssl() {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::On, None);
    let mut c = RawClient::connect(server.tcp[0]);
    assert_eq!(c.option(OPT_STRUCTURED_REPLY, &[]).0, REP_ACK);
    assert_eq!(c.option(OPT_STARTTLS, &[]).0, REP_ACK);
    let mut c = c.start_tls(&p.good);
    assert_eq!(c.option(OPT_STARTTLS, &[]).0, REP_ERR_INVALID);
    // Structured replies were negotiated in plaintext only: forgotten.
    let mut meta = Vec::new();
    meta.extend_from_slice(&4u32.to_be_bytes());
    meta.extend_from_slice(b"ram0");
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&(META_BASE_ALLOCATION.len() as u32).to_be_bytes());
    meta.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
    assert_eq!(c.option(OPT_SET_META_CONTEXT, &meta).0, REP_ERR_INVALID);
    assert_eq!(
        server.shutdown.tls_identities(),
        vec!["client-a".to_owned()]
    );
    let (reply, listing) = c.option(OPT_LIST, &[]);
    assert!(reply == REP_ACK && listing.contains("ram0"), "{listing}");
    assert_eq!(
        c.option(OPT_GO, &encode_info_request("ram0", &[])).0,
        REP_ACK
    );
    // Transmission: write 1 MiB, read it back, over TLS.
    let data = random_bytes(MIB, 5);
    let mut out = Vec::new();
    let write = Request {
        flags: 0,
        command: CMD_WRITE,
        cookie: 1,
        offset: 4096,
        len: MIB as u32,
    };
    encode_request(&mut out, &write);
    out.extend_from_slice(&data);
    let read = Request {
        command: CMD_READ,
        cookie: 2,
        ..write
    };
    encode_request(&mut out, &read);
    c.0.write_all(&out).unwrap();
    let mut reply = [0u8; 16];
    c.0.read_exact(&mut reply).unwrap();
    let Ok(Parse::Done(r, _)) = parse_simple_reply(&reply) else {
        panic!("bad reply");
    };
    assert_eq!((r.cookie, r.error), (1, 0));
    c.0.read_exact(&mut reply).unwrap();
    let Ok(Parse::Done(r, _)) = parse_simple_reply(&reply) else {
        panic!("bad reply");
    };
    assert_eq!((r.cookie, r.error), (2, 0));
    let mut got = vec![0u8; MIB];
    c.0.read_exact(&mut got).unwrap();
    assert!(got == data, "the data read back over TLS differs");
}

/// Plaintext sent right behind STARTTLS (a man in the middle injecting
/// options, nbdkit's CVE-2021-3716) is never read as options: it is taken
/// for the TLS handshake, which fails.
#[test]
fn plaintext_after_starttls_is_not_taken_as_options() {
    if !require_openssl() {
        return;
    }
    let p = pki();
    let (server, _) = with_tls(&p.server, TlsMode::Require, None);
    let mut c = RawClient::connect(server.tcp[0]);
    let mut out = Vec::new();
    encode_option(&mut out, OPT_STARTTLS, &[]);
    encode_option(&mut out, OPT_LIST, &[]);
    c.0.write_all(&out).unwrap();
    let mut header = [0u8; 20];
    c.0.read_exact(&mut header).unwrap();
    let Ok(Parse::Done(h, _)) = parse_option_reply_header(&header) else {
        panic!("bad option reply header");
    };
    assert_eq!((h.option, h.reply), (OPT_STARTTLS, REP_ACK));
    // What follows is a TLS alert or the end, never an option reply.
    let mut rest = Vec::new();
    let _ = c.0.read_to_end(&mut rest);
    assert!(
        rest.is_empty() || rest[0] == 0x15,
        "the server answered the injected option: {rest:02x?}"
    );
    assert!(!String::from_utf8_lossy(&rest).contains("ram0"));
}

// ------------------------------------------------------------ config check

#[test]
fn plaintext_on_a_network_address_must_be_asked_for() {
    let mut c = ServerConfig::new("/nonexistent/nbd.sock");
    c.tcp = vec!["0.0.0.0:10809".parse().unwrap()];
    let e = c.check_tls().unwrap_err();
    assert!(
        matches!(e, TlsConfigError::PlaintextOnNetwork { .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("docs/tls.md") && msg.contains("--tls off"),
        "{msg}"
    );
    c.tls_mode = Some(TlsMode::Off);
    c.check_tls().expect("explicitly off");
    c.tls_mode = Some(TlsMode::Require);
    let e = c.check_tls().unwrap_err();
    assert!(matches!(e, TlsConfigError::NoCertificates { .. }), "{e}");
    c.tls_mode = None;
    c.tcp = vec!["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()];
    c.check_tls().expect("loopback plaintext is fine");
    c.unix_tls_mode = Some(TlsMode::On);
    assert!(c.check_tls().is_err(), "unix TLS without certificates");
}

/// `set_tls`, what the daemon calls: certificates make `require` the
/// default and a network address fine; none leave it refused.
#[test]
fn set_tls_loads_and_checks() {
    if !require_openssl() {
        return;
    }
    let mut c = ServerConfig::new("/nonexistent/nbd.sock");
    c.tcp = vec!["0.0.0.0:10809".parse().unwrap()];
    let e = c.set_tls(None, None, None).unwrap_err();
    assert!(matches!(e, TlsSetupError::Config(_)), "{e}");
    let settings = c.set_tls(None, Some(&pki().server), None).unwrap().unwrap();
    assert_eq!(c.tcp_tls_mode(), TlsMode::Require);
    assert_eq!(c.unix_socket_tls_mode(), TlsMode::On);
    settings.reload().unwrap();
    let e = c
        .set_tls(None, Some(Path::new("/nonexistent")), None)
        .unwrap_err();
    assert!(matches!(e, TlsSetupError::Load(_)), "{e}");
}

// ----------------------------------------------------------------- helpers

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn require_python_nbd() -> bool {
    require(&["nbdsh"]) && common::require_python_module("nbd", "python3-libnbd")
}

/// A fixed-newstyle client that sends options byte by byte, in plaintext
/// or (after STARTTLS) over a rustls client session.
struct RawClient<S = TcpStream>(S);

impl RawClient {
    fn connect(addr: SocketAddr) -> RawClient {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut c = RawClient(s);
        let mut greeting = [0u8; 18];
        c.0.read_exact(&mut greeting).unwrap();
        assert!(matches!(parse_greeting(&greeting), Ok(Parse::Done(..))));
        c.0.write_all(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes())
            .unwrap();
        c
    }

    /// Upgrades to TLS after an acknowledged STARTTLS, trusting the CA in
    /// `client` and showing its certificate.
    fn start_tls(self, client: &Path) -> RawClient<TlsClient> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(client.join("ca-cert.pem")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let chain = CertificateDer::pem_file_iter(client.join("client-cert.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(client.join("client-key.pem")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        let name = "localhost".try_into().unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        RawClient(rustls::StreamOwned::new(conn, self.0))
    }
}

type TlsClient = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

impl<S: Read + Write> RawClient<S> {
    fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut out = Vec::new();
        encode_option(&mut out, option, data);
        self.0.write_all(&out).unwrap();
    }

    /// Sends an option; the final reply's type (ACK or an error) and all
    /// replies' data as text (server names included).
    fn option(&mut self, option: u32, data: &[u8]) -> (u32, String) {
        self.send_option(option, data);
        let mut text = String::new();
        loop {
            let mut header = [0u8; 20];
            self.0.read_exact(&mut header).unwrap();
            let Ok(Parse::Done(h, _)) = parse_option_reply_header(&header) else {
                panic!("bad option reply header");
            };
            let mut body = vec![0u8; h.len as usize];
            self.0.read_exact(&mut body).unwrap();
            text += &String::from_utf8_lossy(&body);
            if h.reply == REP_ACK || h.is_error() {
                return (h.reply, text);
            }
        }
    }

    /// True when the server hung up (end of stream or reset).
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.0.read(&mut byte), Ok(0) | Err(_))
    }
}
