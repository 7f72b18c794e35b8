//! Start-up and shutdown: the one place that wires the daemon together
//! (pid lock, sockets, drives, restores, the NBD server, the API server,
//! signals) and takes it apart again. See `mod.rs` for the order of events.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::api_listen::{self, ApiTransport, HttpEndpoint, Surface, TcpApi};
use super::caches::{self, Caches};
use super::dirs::Dirs;
use super::drives::persistent::{self, drives_dir, probe, scan, Found, Stored};
use super::drives::spec::DriveSpec;
use super::drives::{Drives, Source};
use super::fds;
use super::ledger::{now_unix_s, Ledger, Origin};
use super::lock::PidLock;
use super::logging;
use super::pressure::{self, Pressure};
use super::sampler::Sampler;
use super::snapshots::Snapshots;
use super::tokens::Tokens;
use super::{Daemon, DaemonArgs, DaemonError, Settings};
use crate::handover::listeners;
use crate::nbd::access::AccessTable;
use crate::nbd::tls::{TlsMode, TlsSettings};
use crate::nbd::{ExportTable, Server, ServerConfig};
use crate::size::format_size;
use crate::store::MemoryBudget;

/// Blocks SIGINT, SIGTERM (shutdown) and SIGHUP (reload the TLS
/// certificates) in this thread and every thread spawned after (call
/// first), returning the set for `sigwait`; takes the supervisor's link
/// first when one started this process (before any thread: it edits the
/// environment). With `--supervise` and no supervisor yet, this process
/// becomes the supervisor (`handover::supervisor`): it runs the daemon as
/// its child, started again with the same arguments if it dies, and
/// exits with it.
fn block_shutdown_signals(args: &DaemonArgs) -> Result<libc::sigset_t, DaemonError> {
    if args.supervise && std::env::var_os(crate::handover::serving::FD_ENV).is_none() {
        let args = std::env::args_os().skip(1).collect();
        std::process::exit(crate::handover::supervisor::run(args));
    }
    // Blocked first: a stop asked for while the hand-back is read waits
    // for the signal thread (a graceful stop) instead of killing us.
    let set = block_signals();
    crate::handover::serving::init_from_env()
        .map_err(|e| DaemonError::Start(std::io::Error::other(format!("supervisor link: {e}"))))?;
    Ok(set)
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use;
    // pthread_sigmask only changes this thread's mask (inherited by threads
    // spawned later).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Makes sure the directories the lock and sockets go into are the
/// daemon's own (`paths::ensure_runtime_dir`; a socket directory named
/// on the command line: `paths::ensure_socket_dir`).
fn secure_socket_dirs(s: &Settings) -> Result<(), DaemonError> {
    crate::paths::ensure_runtime_dir(&s.runtime_dir)?;
    for sock in [&s.api_socket, &s.nbd_socket] {
        if let Some(dir) = sock.parent().filter(|d| !d.as_os_str().is_empty()) {
            if dir != s.runtime_dir {
                crate::paths::ensure_socket_dir(dir)?;
            }
        }
    }
    Ok(())
}

/// Binds the API socket with mode 0600, whatever the umask: the socket's
/// inode gets 0600 before `bind` (Linux creates the file with the
/// socket's mode minus the umask), and the file exactly 0600 right after.
/// The process umask is never touched (other threads run by now).
fn bind_api(path: &Path) -> Result<std::os::unix::net::UnixListener, DaemonError> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let err = |source| DaemonError::Api {
        path: path.to_owned(),
        source,
    };
    let last = || std::io::Error::last_os_error();
    // The pid lock is held: a socket file here is a dead daemon's.
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path).map_err(err)?;
    }
    // SAFETY: socket(2) takes no pointers; the fd is owned right away.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(err(last()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod on a descriptor we own; no memory is passed.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(err(last()));
    }
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("the path is longer than {} bytes", addr.sun_path.len() - 1),
        )));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is an initialised sockaddr_un, NUL-terminated within
    // `len` bytes, and outlives the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(err(last()));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    // SAFETY: listen on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(err(last()));
    }
    Ok(std::os::unix::net::UnixListener::from(fd))
}

/// The drives the settings declare (and those stored in the state
/// directory), then every declared cache, all claiming their names and
/// memory in `ledger`.
fn create_declared(
    settings: &Settings,
    ledger: &Arc<Ledger>,
) -> Result<(Arc<Drives>, Arc<Caches>), DaemonError> {
    let drives = Arc::new(
        Drives::new(ledger.clone(), settings.metrics).with_state_dir(settings.state_dir.clone()),
    );
    // Drives a supervisor kept across a restart first: a declared drive
    // of the same name is the kept one, with its data.
    let kept = drives.adopt_handed_back();
    for (spec, origin) in &settings.drives {
        if kept.contains(&spec.name) {
            continue;
        }
        let declared = Source::Declared(origin.clone());
        drives
            .create_from(spec.clone(), declared)
            .map_err(|source| {
                let message = format!("cannot create drive '{}': {source}", spec.name);
                settings
                    .declared(&spec.name, origin, &message)
                    .unwrap_or(DaemonError::Drive {
                        name: spec.name.clone(),
                        source: Box::new(source),
                    })
            })?;
    }
    // Persistent drives created through the API (or no longer declared)
    // come back too; restores run in the background, READY=1 waits.
    restore_stored(&drives, settings);
    drives.forget_unclaimed_kept();
    drives.keep_metrics();
    // Caches after every drive: a name both declare goes to the drive.
    let caches = Arc::new(Caches::new(
        ledger.clone(),
        settings.metrics,
        drives.access_table(),
    ));
    // Dirty data caches left when the last serving process was killed
    // goes to its backings before any cache opens over them.
    let rescue_root = settings.state_dir.join("cache-rescue");
    caches.take_kept(&rescue_root);
    let cache_origin = settings
        .config_path
        .clone()
        .map_or(Origin::CommandLine, Origin::Config);
    for spec in &settings.caches {
        caches
            .create_at_start(spec.clone(), cache_origin.clone())
            .map_err(|source| {
                let message = format!("cannot create cache '{}': {source}", spec.name);
                settings
                    .declared(&spec.name, &cache_origin, &message)
                    .unwrap_or(DaemonError::Cache {
                        name: spec.name.clone(),
                        source,
                    })
            })?;
    }
    caches.settle_waiting(&rescue_root, caches::kept::Waiters::Orphans);
    Ok((drives, caches))
}

/// What start-up creates before the listeners.
type Declared = (Arc<Drives>, Arc<Caches>, Arc<Snapshots>);

/// The declared drives and caches with the snapshot side: the remotes,
/// the drives `restore_from` fills (restored here, before NBD binds, so
/// they are never served empty or partial) and the schedule.
fn create_with_snapshots(
    settings: &Settings,
    ledger: &Arc<Ledger>,
) -> Result<Declared, DaemonError> {
    let persistent =
        |name: &str| (settings.drives.iter()).any(|(d, _)| d.name == name && d.persist.is_some());
    let (snapshots, restores_due) = super::snapshots::prepare(
        settings.remotes.clone(),
        settings.snapshot_policies.clone(),
        &settings.state_dir,
        &persistent,
    )?;
    // Persistent drives' state directories first (crash-safe, staged),
    // so those drives are created from them; RAM drives once created.
    snapshots.restore_to_disk_at_start(
        &settings.drives,
        &restores_due,
        &settings.state_dir,
        ledger.budget(),
    )?;
    let (drives, caches) = create_declared(settings, ledger)?;
    snapshots.restore_at_start(&drives, &restores_due)?;
    super::snapshots::schedule::start(&snapshots, &drives, &caches)?;
    Ok((drives, caches, snapshots))
}

/// An error naming every cache whose dirty data did not reach its
/// backing at shutdown (rescued where, or lost).
fn cache_shutdown_result(
    outcomes: &[(String, caches::shutdown::Outcome)],
) -> Result<(), DaemonError> {
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| o.failed())
        .map(|(name, o)| match o {
            caches::shutdown::Outcome::Rescued {
                saved_bytes, dir, ..
            } => format!(
                "cache '{name}': {} of dirty data saved to {} (run its apply.sh once the backing works)",
                format_size(*saved_bytes),
                dir.display()
            ),
            _ => format!("cache '{name}': dirty data LOST (see the log)"),
        })
        .collect();
    if !failed.is_empty() {
        tracing::error!(
            "stopped, but not every cache could write back: {}",
            failed.join("; ")
        );
        return Err(DaemonError::CacheData { failed });
    }
    Ok(())
}

/// The bound server, its certificates and the TLS mode of its TCP
/// listeners.
/// The bound server, its certificates, and the TLS modes it resolved for
/// (TCP, the unix socket).
type BoundNbd = (Server, Option<Arc<TlsSettings>>, (TlsMode, TlsMode));

/// The NBD server bound to the settings' sockets, with its certificates
/// (None: no TLS). TLS settings the server would refuse (certificates
/// that do not load, plaintext on a network address not asked for) stop
/// the start before anything is bound. A refused bind leaves no socket
/// behind (one bound by a listener that failed after it, say a TCP port
/// in use). The socket gets its group (`--nbd-socket-group`) right after
/// the bind, while it is still 0600 (only our user could have connected).
fn bind_nbd(
    settings: &Settings,
    exports: Arc<ExportTable>,
    access: Arc<AccessTable>,
    fds: &fds::Plan,
) -> Result<BoundNbd, DaemonError> {
    let mut nbd_config = ServerConfig::new(&settings.nbd_socket);
    nbd_config.tcp = settings.nbd_listen.clone();
    nbd_config.max_connections = fds.nbd;
    nbd_config.max_connections_per_address = settings.max_connections_per_address;
    nbd_config.max_connections_per_identity = settings.max_connections_per_identity;
    nbd_config.poll_us = settings.poll_us;
    nbd_config.keep_cpu_awake = settings.keep_cpu_awake;
    nbd_config.unix_tls_mode = settings.unix_tls_mode;
    nbd_config.access = access;
    let gid = settings
        .nbd_socket_group
        .as_deref()
        .map(group_id)
        .transpose()?;
    let tls = nbd_config.set_tls(
        settings.tls_mode,
        settings.tls_certificates.as_deref(),
        settings.tls_verify_peer,
    )?;
    let modes = (nbd_config.tcp_tls_mode(), nbd_config.unix_socket_tls_mode());
    let nbd_before = file_id(&settings.nbd_socket);
    let remove_new = || {
        if file_id(&settings.nbd_socket) != nbd_before {
            remove_if_socket(&settings.nbd_socket);
        }
    };
    let server = Server::bind(nbd_config, exports).map_err(|e| {
        remove_new();
        DaemonError::Nbd(e)
    })?;
    if let (Some(gid), Some(group)) = (gid, &settings.nbd_socket_group) {
        give_socket_group(&settings.nbd_socket, gid, group).inspect_err(|_| remove_new())?;
    }
    log_tls(&server, settings, modes, tls.as_deref());
    Ok((server, tls, modes))
}

/// Says which listeners use TLS and how; warns about plaintext on an
/// address other machines can reach (only ever asked for explicitly:
/// `check_tls` refuses it otherwise).
fn log_tls(
    server: &Server,
    settings: &Settings,
    (tcp_mode, unix_mode): (TlsMode, TlsMode),
    tls: Option<&TlsSettings>,
) {
    let certs = tls.map_or(String::new(), |t| {
        format!(
            " (certificates {}, client certificates {})",
            t.dir().display(),
            super::config::verify_peer_name(t.client_certs())
        )
    });
    for addr in server.tcp_addrs() {
        tracing::info!("NBD on {addr}: TLS {tcp_mode}{certs}");
        if tcp_mode == TlsMode::Off && !addr.ip().is_loopback() {
            tracing::warn!(
                "NBD on {addr} is plaintext and reachable from other machines (--tls off): anyone who can reach it can read and write every drive"
            );
        }
    }
    tracing::info!("NBD on {}: TLS {unix_mode}", settings.nbd_socket.display());
}

/// Raises the descriptor limit and shares it between the listeners
/// (`fds`), saying so; warns when NBD gets fewer connections than asked.
fn descriptor_plan(settings: &Settings) -> fds::Plan {
    let web = usize::from(settings.api_listen.is_some()) + usize::from(settings.http.is_some());
    let plan = fds::Plan::new(fds::raise_limit(), settings.max_connections, web);
    if plan.nbd < settings.max_connections {
        tracing::warn!(
            "NBD serves at most {} connections, not {}: the file descriptor limit is {} (raise it, e.g. LimitNOFILE= in the systemd unit or ulimit -n)",
            plan.nbd, settings.max_connections, plan.limit
        );
    }
    tracing::debug!(
        "file descriptors: limit {}, {} kept back, NBD up to {} connections, each web listener up to {}",
        plan.limit, plan.reserved, plan.nbd, plan.web
    );
    plan
}

/// The API's TCP listeners (`--api-listen`, `--http`), bound, with their
/// transports; refused (stopping the start) without TLS off loopback.
/// The API's unix socket (kept across a restart under a supervisor, or
/// bound) and TCP listeners; then every listener is bound, so the ones a
/// supervisor kept that the settings no longer name are closed.
fn bind_apis(
    settings: &Settings,
    tls: Option<&Arc<TlsSettings>>,
    fds: &fds::Plan,
) -> Result<(std::os::unix::net::UnixListener, Vec<TcpApi>), DaemonError> {
    let api_path = settings.api_socket.as_path();
    let api_key = listeners::key("api-unix", api_path.display());
    let api_listener = listeners::kept_or_bind(&api_key, Some(api_path), || bind_api(api_path))?;
    // Owner only, whatever a kept socket's file was given since.
    std::fs::set_permissions(api_path, std::fs::Permissions::from_mode(0o600)).map_err(
        |source| DaemonError::Api {
            path: api_path.to_owned(),
            source,
        },
    )?;
    api_listener
        .set_nonblocking(true)
        .map_err(DaemonError::Start)?;
    let api_tcp = bind_api_tcp(settings, tls, fds)?;
    listeners::forget_unclaimed();
    Ok((api_listener, api_tcp))
}

fn bind_api_tcp(
    settings: &Settings,
    tls: Option<&Arc<TlsSettings>>,
    fds: &fds::Plan,
) -> Result<Vec<TcpApi>, DaemonError> {
    let mut apis =
        api_listen::bind_all(settings.api_listen, settings.http, settings.tls_mode, tls)?;
    for api in &mut apis {
        api.max_connections = fds.web;
        let bound = api.listener.local_addr().map_err(DaemonError::Start)?;
        let (what, open) = match api.surface {
            Surface::Api => ("API also", ""),
            Surface::Dashboard => ("Dashboard and API", "; open it with `ramd dashboard`"),
        };
        match &api.transport {
            ApiTransport::Tls(t) => tracing::info!(
                "{what} on https://{bound} (TLS, certificates {}; bearer tokens: ramd token create{open})",
                t.dir().display()
            ),
            ApiTransport::Plaintext => tracing::warn!(
                "{what} on http://{bound}: plaintext (--tls off, loopback only); bearer tokens: ramd token create{open}"
            ),
        }
    }
    Ok(apis)
}

/// Where the dashboard listens, if it does (`--http`).
fn http_endpoint(apis: &[TcpApi]) -> Result<Option<HttpEndpoint>, DaemonError> {
    let Some(api) = apis.iter().find(|a| a.surface == Surface::Dashboard) else {
        return Ok(None);
    };
    Ok(Some(HttpEndpoint {
        addr: api.listener.local_addr().map_err(DaemonError::Start)?,
        tls: matches!(api.transport, ApiTransport::Tls(_)),
    }))
}

type ApiTcpTask = tokio::task::JoinHandle<std::io::Result<()>>;

/// The daemon's async side: samplers, READY=1 once restored, the API on
/// its unix socket and (`--api-listen`, `--http`) on TCP, until `stop`
/// says so; returns once all finished their requests.
async fn serve_apis(
    daemon: Arc<Daemon>,
    api_listener: std::os::unix::net::UnixListener,
    api_tcp: Vec<TcpApi>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let listener = tokio::net::UnixListener::from_std(api_listener)?;
    tokio::spawn(daemon.sampler.clone().run(daemon.drives.clone()));
    tokio::spawn(caches::sample_loop(daemon.caches.clone()));
    // READY=1 once no drive is restoring (the API answers meanwhile).
    let r = daemon.drives.clone();
    tokio::task::spawn_blocking(move || notify_ready_when_restored(&r));
    let remote: Vec<_> = api_tcp
        .into_iter()
        .map(|tcp| spawn_api_tcp(tcp, &daemon, stop_rx.clone()))
        .collect();
    let mut stop = stop_rx;
    let served = crate::api::serve(listener, daemon.clone(), async move {
        let _ = stop.wait_for(|s| *s).await;
    })
    .await;
    for task in remote {
        join_api_tcp(task).await;
    }
    served
}

/// Serves the API on TCP until `stop` says so.
fn spawn_api_tcp(
    tcp: TcpApi,
    daemon: &Arc<Daemon>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> ApiTcpTask {
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let serve = crate::api::server::tcp::serve(tcp, daemon.clone(), stopped);
    tokio::spawn(serve)
}

/// Waits for the TCP API to finish its requests; logs its failure.
async fn join_api_tcp(task: ApiTcpTask) {
    match task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("API server on TCP failed: {e}"),
        Err(e) => tracing::error!("API server on TCP panicked: {e}"),
    }
}

/// The number of a group given by name or number.
fn group_id(group: &str) -> Result<u32, super::SocketGroupError> {
    use super::SocketGroupError as E;
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).map_err(|_| E::Unknown(group.to_owned()))?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: group is plain data, zeroed is a valid value.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: `name` NUL-terminated,
    // `buf` of the length given, `grp` and `found` writable; the result
    // is read only through `grp` while `buf` lives.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(E::Lookup {
            group: group.to_owned(),
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    if found.is_null() {
        return Err(E::Unknown(group.to_owned()));
    }
    Ok(grp.gr_gid)
}

/// The NBD socket: group `gid`, mode 0660, so the group's members may
/// connect (they also need to reach the socket's directory).
fn give_socket_group(path: &Path, gid: u32, group: &str) -> Result<(), DaemonError> {
    let err = |e: std::io::Error| super::SocketGroupError::Chown {
        path: path.to_owned(),
        group: group.to_owned(),
        source: e,
    };
    let gid = rustix::fs::Gid::from_raw(gid);
    rustix::fs::chown(path, None, Some(gid)).map_err(|e| err(e.into()))?;
    rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(0o660)).map_err(|e| err(e.into()))?;
    tracing::info!("NBD socket {}: group {group}, mode 0660", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let_group_through(dir, gid, group).map_err(|e| err(e.into()))?;
    }
    Ok(())
}

/// Lets the socket's group pass through the socket's directory (search
/// only, mode g+x: members can open the socket by name but not list or
/// change the directory) when it is ours and the group could not pass
/// yet, as the 0700 runtime directory the daemon makes for itself.
/// Directories others may already pass (o+x, such as /tmp) stay as they are.
fn let_group_through(dir: &Path, gid: rustix::fs::Gid, group: &str) -> rustix::io::Result<()> {
    let st = rustix::fs::stat(dir)?;
    let mode = st.st_mode & 0o7777;
    let ours = st.st_uid == rustix::process::geteuid().as_raw();
    let group_passes = st.st_gid == gid.as_raw() && mode & 0o010 != 0;
    if !ours || mode & 0o001 != 0 || group_passes {
        return Ok(());
    }
    rustix::fs::chown(dir, None, Some(gid))?;
    rustix::fs::chmod(dir, rustix::fs::Mode::from_raw_mode(mode | 0o010))?;
    tracing::info!(
        "{}: group {group} may pass through it (mode {:04o}) to reach the NBD socket",
        dir.display(),
        mode | 0o010
    );
    Ok(())
}

/// A thread that waits for the `signals` (blocked in every thread): on
/// SIGHUP it reloads the TLS certificates (a failure is logged and the
/// old ones stay); on SIGTERM/SIGINT it tells systemd and the API to stop.
fn spawn_signal_waiter(
    signals: libc::sigset_t,
    daemon: Arc<Daemon>,
    stop_tx: tokio::sync::watch::Sender<bool>,
) -> Result<(), DaemonError> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `signals` is an initialised sigset and `sig` a valid
            // out pointer; the signals are blocked in every thread.
            unsafe { libc::sigwait(&signals, &mut sig) };
            if sig == libc::SIGHUP {
                match daemon.reload_tls() {
                    Ok(dir) => {
                        tracing::info!("SIGHUP: TLS certificates reloaded from {}", dir.display())
                    }
                    Err(e) => tracing::warn!("SIGHUP: {e}"),
                }
                continue;
            }
            tracing::info!("signal {sig}: finishing open requests and shutting down");
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
            let _ = stop_tx.send(true);
            return;
        })
        .map_err(DaemonError::Start)?;
    Ok(())
}

/// READY=1 to systemd once no drive is restoring (the API answers
/// meanwhile).
fn notify_ready_when_restored(drives: &Drives) {
    wait_restores(drives);
    let _ = sd_notify::notify(
        false,
        &[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&format!("serving {} drive(s)", drives.list().len())),
        ],
    );
}

/// Syncs and releases the directories in RAM, telling systemd so.
fn stop_dirs(dirs: &Dirs) {
    if !dirs.manager.paths().is_empty() {
        let _ = sd_notify::notify(
            false,
            &[sd_notify::NotifyState::Status(
                "syncing directories to disk",
            )],
        );
    }
    dirs.stop();
}

/// Runs the daemon until SIGTERM/SIGINT.
pub fn run(args: DaemonArgs) -> Result<(), DaemonError> {
    let signals = block_shutdown_signals(&args)?;
    let settings = Settings::resolve(&args)?;
    logging::init(settings.log.as_deref(), settings.log_format);
    secure_socket_dirs(&settings)?;
    let _lock = PidLock::acquire(&settings.api_socket)?;
    // Each narrowed mode is logged (WARN) where it is fixed.
    persistent::modes::secure_state_dir(&settings.state_dir)?;
    let tokens = Arc::new(Tokens::load(&settings.state_dir)?);

    let budget = Arc::new(match settings.mem_budget_bytes {
        Some(b) => MemoryBudget::new(b),
        None => MemoryBudget::default_daemon(),
    });
    let (pressure, pressure_stop) = start_pressure(&settings, &budget)?;
    let exports = Arc::new(ExportTable::new());
    let ledger = Arc::new(Ledger::new(exports.clone(), budget));
    let (drives, caches, snapshots) = create_with_snapshots(&settings, &ledger)?;
    pressure.add_give_back(caches.clone());
    pressure.add_give_back(drives.clone());

    // A refused start leaves no socket behind: from here on the NBD and
    // API sockets, until the daemon serves.
    let nvme = start_nvme(&settings, &exports, drives.access_table())?;
    let fds = descriptor_plan(&settings);
    let (server, tls, (tcp_tls_mode, unix_tls_mode)) =
        bind_nbd(&settings, exports, drives.access_table(), &fds)?;
    let mut bound = BoundSockets {
        paths: [settings.nbd_socket.as_path(), settings.api_socket.as_path()],
        serving: false,
    };
    let nbd_handle = server.shutdown_handle();
    let nvme_target = nvme.as_ref().map(|n| n.target.clone());
    drives.set_servers(nbd_handle.clone(), nvme_target.clone());
    caches.set_servers(nbd_handle.clone(), nvme_target);
    let tcp_addrs = server.tcp_addrs().to_vec();

    let (api_listener, api_tcp) = bind_apis(&settings, tls.as_ref(), &fds)?;
    let http = http_endpoint(&api_tcp)?;
    // Before the API serves and before READY=1: every directory is in RAM
    // (or listed as failed) before anything may use it. API requests made
    // meanwhile wait in the listen queue.
    let dirs = Dirs::start(
        settings.runtime_dir.join("dirs"),
        settings.state_dir.join("dirs"),
        settings.config_path.as_deref(),
        &settings.dirs,
    )
    .inspect_err(|_| remove_if_socket(&settings.api_socket))?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let daemon = Arc::new(Daemon {
        ledger,
        drives: drives.clone(),
        attachments: crate::control::kept_attachments::attachments(),
        ublk: crate::ublk::Devices::new(&settings.runtime_dir),
        settings: settings.clone(),
        tcp_addrs,
        nvme_node: nvme.as_ref().map(|n| n.node.clone()),
        nvme_target: nvme.as_ref().map(|n| n.target.clone()),
        started: Instant::now(),
        started_unix_s: now_unix_s(),
        sampler: Arc::new(Sampler::new()),
        caches: caches.clone(),
        dirs: Arc::new(dirs),
        tls,
        tcp_tls_mode,
        unix_tls_mode,
        nbd_refusals: nbd_handle.refusals(),
        tokens,
        sessions: Arc::default(),
        http,
        stopping: stop_rx.clone(),
        snapshots,
        pressure,
    });

    let nbd_thread = std::thread::Builder::new()
        .name("nbd-accept".into())
        .spawn(move || server.run())
        .map_err(DaemonError::Start)?;

    let runtime = api_runtime()?;
    spawn_signal_waiter(signals, daemon.clone(), stop_tx)?;

    bound.serving = true;
    announce(&daemon);
    let served = runtime.block_on(serve_apis(daemon.clone(), api_listener, api_tcp, stop_rx));
    if let Err(e) = &served {
        tracing::error!("API server failed: {e}");
    }
    // No more API requests: sync and release the directories in RAM (the
    // systemd unit's stop ordering relies on this happening before exit).
    stop_dirs(&daemon.dirs);
    // The API has stopped; now NBD: finish in-flight requests, close.
    stop_nvme(nvme);
    stop_nbd(&nbd_handle, nbd_thread);
    detach_all(&daemon);
    // Final counts for the next process (an upgrade's).
    drives.send_kept_metrics();
    pressure_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // No client can write any more: save every persistent drive, and
    // write every cache back (bounded, loud).
    drives.shutdown_persistent();
    let outcomes = stop_caches(&daemon.caches, &settings.state_dir.join("cache-rescue"));
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    if !listeners::keep_socket_files() {
        remove_if_socket(&settings.api_socket);
    }
    cache_shutdown_result(&outcomes)?;
    tracing::info!("stopped");
    Ok(())
}

/// The tokio runtime of the API (two worker threads: requests are small;
/// blocking work goes to `spawn_blocking`).
fn api_runtime() -> Result<tokio::runtime::Runtime, DaemonError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ramd-api")
        .enable_all()
        .build()
        .map_err(DaemonError::Start)
}

/// Tells the supervisor (if one started this process) that it serves,
/// and starts watching for its death.
fn announce_supervised() {
    let Some(s) = crate::handover::serving::get() else {
        return;
    };
    let st = s.status();
    tracing::info!(
        supervisor_pid = st.supervisor_pid,
        restarts = st.restarts,
        last_restart = st.last_restart_reason.as_deref().unwrap_or("-"),
        "supervised: RAM drives survive a crash of this process"
    );
    if let Err(e) = s.ready() {
        tracing::error!("cannot tell the supervisor this process serves: {e}");
    }
    if let Err(e) = s.watch() {
        tracing::error!("cannot watch the supervisor: {e}");
    }
}

/// Starts the NVMe/TCP target when `--nvme-listen` asks for it (before
/// any socket is bound: a refusal leaves nothing behind).
fn start_nvme(
    settings: &Settings,
    exports: &Arc<ExportTable>,
    access: Arc<AccessTable>,
) -> Result<Option<super::nvme_listen::RunningNvme>, DaemonError> {
    if settings.nvme_listen.is_empty() {
        return Ok(None);
    }
    let node = super::nvme_listen::node_id(&settings.state_dir)?;
    let running = super::nvme_listen::start(
        &settings.nvme_listen,
        settings.nvme_plaintext,
        &node,
        exports.clone(),
        access,
    )?;
    Ok(Some(running))
}

/// Stops the NBD server: in-flight requests finish, connections close.
fn stop_nbd(
    handle: &crate::nbd::ShutdownHandle,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
) {
    handle.shutdown();
    match thread.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("NBD server: {e}"),
        Err(_) => tracing::error!("NBD server thread panicked"),
    }
}

/// Stops the NVMe/TCP target (hosts see their connections drop and
/// reconnect to the next daemon) and waits for its connections to end.
/// Writes every cache back (bounded, loud): kept cache data still waiting
/// for its backing too, unless the next process takes it (an upgrade),
/// since the keeper ends with this stop.
fn stop_caches(caches: &Caches, rescue_root: &Path) -> Vec<(String, caches::shutdown::Outcome)> {
    if !crate::handover::serving::get().is_some_and(|s| s.upgrading()) {
        caches.settle_waiting(rescue_root, caches::kept::Waiters::All);
    }
    caches.shutdown(rescue_root)
}

fn stop_nvme(nvme: Option<super::nvme_listen::RunningNvme>) {
    if let Some(n) = nvme {
        n.shutdown.shutdown();
        match n.thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("NVMe/TCP target: {e}"),
            Err(_) => tracing::error!("NVMe/TCP target thread panicked"),
        }
    }
}

/// Starts the memory-pressure watcher over the daemon-wide budget; it
/// stops when the returned flag is set.
fn start_pressure(
    settings: &Settings,
    budget: &Arc<MemoryBudget>,
) -> Result<(Arc<Pressure>, Arc<AtomicBool>), DaemonError> {
    let pressure = Arc::new(Pressure::default());
    let stop = Arc::new(AtomicBool::new(false));
    pressure::spawn(
        pressure.clone(),
        settings.pressure,
        budget.clone(),
        stop.clone(),
    )
    .map_err(DaemonError::Start)?;
    Ok((pressure, stop))
}

/// The sockets a start has bound, removed again when the start is
/// refused (dropped before `serving` is set).
struct BoundSockets<'a> {
    paths: [&'a Path; 2],
    serving: bool,
}

impl Drop for BoundSockets<'_> {
    fn drop(&mut self) {
        if !self.serving {
            for p in self.paths {
                remove_if_socket(p);
            }
        }
    }
}

/// Device and inode of a file (None: no file), to tell a socket this
/// process bound from one that was there before.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn remove_if_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Tells the user where everything is and what to try.
fn announce(d: &Arc<Daemon>) {
    // Ready: take over the ublk devices an earlier ramd left behind.
    if let Err(e) = recover_ublk(d) {
        tracing::error!("cannot start recovering ublk devices: {e}");
    }
    if let Err(e) = resume_fuse(d) {
        tracing::error!("cannot start resuming FUSE attachments: {e}");
    }
    announce_supervised();
    let s = &d.settings;
    let drives = d.drives.list();
    tracing::info!(
        "ramd {} ready: {} drive(s), memory budget {}, API {}",
        env!("CARGO_PKG_VERSION"),
        drives.len(),
        format_size(d.drives.budget().limit_bytes()),
        s.api_socket.display()
    );
    if let Some(p) = &s.config_path {
        tracing::info!("config: {}", p.display());
    }
    for c in d.caches.list() {
        tracing::info!(
            "cache {} ({}, {}) at {}",
            c.name,
            c.spec.summary(),
            c.state().name(),
            d.unix_uri(&c.name)
        );
    }
    let dirs = d.dirs.manager.paths();
    if !dirs.is_empty() {
        tracing::info!(
            "{} director{} in RAM (ramd dir list)",
            dirs.len(),
            if dirs.len() == 1 { "y" } else { "ies" }
        );
    }
    for drive in &drives {
        tracing::info!(
            "drive {} ({}{}) at {}",
            drive.name,
            format_size(drive.size_bytes()),
            if drive.export.is_read_only() {
                ", read-only"
            } else {
                ""
            },
            d.unix_uri(&drive.name)
        );
        for uri in d.tcp_uris(&drive.name) {
            tracing::info!("drive {} also at {uri}", drive.name);
        }
    }
    let client_env = if s.api_socket == crate::paths::api_socket() {
        String::new()
    } else {
        format!("RAMD_API_SOCKET={} ", s.api_socket.display())
    };
    if let Some(first) = drives.first() {
        tracing::info!("try: nbdinfo '{}'", d.unix_uri(&first.name));
        tracing::info!(
            "attach as a file: mkdir -p /mnt/{n} && {client_env}ramd attach {n} /mnt/{n} && losetup -f --show /mnt/{n}/{n}",
            n = first.name
        );
    }
    tracing::info!("manage: {client_env}ramd list | ramd create NAME --size 4G | ramd stats --watch   (stop with Ctrl-C)");
}

/// Registers the persistent drives in the state directory that nothing
/// declares (created through the API, or removed from the config): each
/// restores in the background. Logged, never fatal: the daemon serves the
/// others.
pub fn restore_stored(drives: &Arc<Drives>, settings: &Settings) {
    let declared: Vec<String> = settings
        .drives
        .iter()
        .map(|(d, _)| d.name.clone())
        .collect();
    for (spec, _) in &settings.drives {
        if spec.persist.is_none()
            && probe(&drives_dir(&settings.state_dir).join(&spec.name)) != Found::New
        {
            tracing::warn!(
                drive = %spec.name,
                "is declared as a RAM drive, so its state directory {} is not used (and left as it is)",
                drives_dir(&settings.state_dir).join(&spec.name).display()
            );
        }
    }
    for found in scan(&drives_dir(&settings.state_dir), &declared) {
        let r = match found {
            Stored::Drive(spec) => drives.create_from(spec, Source::Stored),
            Stored::Unusable { name, error } => {
                drives.create_from(DriveSpec::failed(&name), Source::Unusable(error))
            }
        };
        if let Err(e) = r {
            tracing::error!("a drive in the state directory could not be registered: {e}");
        }
    }
}

/// Blocks until no drive is restoring, telling systemd how far it is
/// (STATUS=, and EXTEND_TIMEOUT_USEC so a long restore is not killed as a
/// failed start).
pub fn wait_restores(drives: &Drives) {
    let mut last_status = std::time::Instant::now() - std::time::Duration::from_secs(10);
    loop {
        let restoring = drives.restoring();
        if restoring.is_empty() {
            return;
        }
        if last_status.elapsed() >= std::time::Duration::from_secs(5) {
            last_status = std::time::Instant::now();
            let text: Vec<String> = restoring
                .iter()
                .map(|d| {
                    format!(
                        "{} ({})",
                        d.name,
                        d.persist
                            .as_ref()
                            .map_or_else(String::new, |p| p.restore_text())
                    )
                })
                .collect();
            let status = format!("restoring {}", text.join(", "));
            tracing::info!("{status}");
            let _ = sd_notify::notify(
                false,
                &[
                    sd_notify::NotifyState::Status(&status),
                    sd_notify::NotifyState::ExtendTimeoutUsec(30_000_000),
                ],
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// At exit: unmounts the FUSE attachments, removes the ublk devices
/// (both left to the next process when stopping for an upgrade: ublk
/// devices wait, quiesced, and it recovers them as after a crash; FUSE
/// sessions are resumed from what the keeper holds).
fn detach_all(daemon: &Daemon) {
    let upgrading = crate::handover::serving::get().is_some_and(|s| s.upgrading());
    daemon.attachments.shutdown(upgrading);
    if upgrading {
        tracing::info!("upgrade: ublk devices stay for the next process");
        return;
    }
    daemon.ublk.shutdown();
}

/// Asks `f` every 100 ms until it answers (`Some`: found, or `None`: not
/// there), for `limit` at most (then None).
fn wait_answer<T>(
    limit: std::time::Duration,
    mut f: impl FnMut() -> Option<Option<T>>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(answer) = f() {
            return answer;
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Resumes the FUSE sessions a keeper held (`kept_attachments`), on a
/// thread of its own: each waits (10 minutes at most) for its drive's
/// restore or its cache's backing.
fn resume_fuse(daemon: &Arc<Daemon>) -> Result<(), DaemonError> {
    const WAIT: std::time::Duration = std::time::Duration::from_secs(600);
    let d = daemon.clone();
    std::thread::Builder::new()
        .name("fuse-resume".into())
        .spawn(move || {
            let attachable = |name: &str| -> Option<Arc<dyn crate::fuse::Attachable>> {
                wait_answer(
                    WAIT,
                    || -> Option<Option<Arc<dyn crate::fuse::Attachable>>> {
                        if let Ok(x) = d.drives.get_ready(name) {
                            return Some(Some(x));
                        }
                        match d.caches.get(name) {
                            Ok(c) if c.live().is_some() => Some(Some(c)),
                            Ok(_) => None,
                            Err(_) if d.drives.get(name).is_ok() => None,
                            Err(_) => Some(None),
                        }
                    },
                )
            };
            crate::control::kept_attachments::resume(&d.attachments, &attachable);
        })
        .map(drop)
        .map_err(DaemonError::Start)
}

/// Attaches the drives the config marks `attach = "ublk"` that have no
/// device yet (none was recovered for them); a failure is logged with
/// what to do, and the daemon serves on without the device.
fn attach_configured_ublk(d: &Daemon, drive: &crate::ublk::DriveLookup<'_>) {
    for name in &d.settings.attach_ublk {
        if d.ublk.find_drive(name).is_some() {
            continue;
        }
        let Some((x, _)) = drive(name) else {
            tracing::error!(
                "drive '{name}' (attach = \"ublk\") is not ready: no ublk device for it"
            );
            continue;
        };
        match d.ublk.attach(x, d.attachments.reserve_id()) {
            Ok(info) => tracing::info!(
                "drive '{name}' attached as {} (config: attach = \"ublk\")",
                info.block_device().display()
            ),
            Err(e) => tracing::error!(
                "cannot attach drive '{name}' as a ublk device (config: attach = \"ublk\"): {e}"
            ),
        }
    }
}

/// Takes over, in the background, the ublk devices an earlier ramd left
/// quiesced (see `ublk`): each waits for its drive to serve (a persistent
/// drive restores first) while the kernel holds its I/O; then attaches
/// the drives the config marks `attach = "ublk"`.
fn recover_ublk(daemon: &Arc<Daemon>) -> Result<(), DaemonError> {
    /// How long a device waits for its drive's restore.
    const DRIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);
    let d = daemon.clone();
    std::thread::Builder::new()
        .name("ublk-recover".into())
        .spawn(move || {
            let drive = |name: &str| {
                wait_answer(DRIVE_WAIT, || match d.drives.get_ready(name) {
                    Ok(x) => {
                        // Its data outlived the old ramd: on disk, or in a
                        // memfd a supervisor kept.
                        let persistent = x.persist.is_some() || d.drives.adopted_at_start(name);
                        let x: Arc<dyn crate::fuse::Attachable> = x;
                        Some(Some((x, persistent)))
                    }
                    // Still restoring: ask again.
                    Err(_) if d.drives.get(name).is_ok() => None,
                    Err(_) => Some(None),
                })
            };
            d.ublk.recover(&drive, &|| d.attachments.reserve_id());
            attach_configured_ublk(&d, &drive);
        })
        .map(drop)
        .map_err(DaemonError::Start)
}
