//! The `ramd` command line (clap): `daemon` runs the server; every other
//! command is a thin client of its REST API over the unix socket (or, with
//! `--host`, over TCP with TLS and a bearer token: `token`).
//!
//! Invariant: the client commands import only `api::client`, `api::wire`
//! and the pure helpers `crate::size` (sizes as people write them) and
//! `crate::paths` (the default socket path); `daemon.rs` is the one file
//! that names the server side (scripts/arch_check.py, rule 4). So what a
//! command can show or send is exactly what the API offers.
//!
//! One file per command family: `drives` (create, list, resize, lock,
//! unlock, delete), `persist` (sync, restore, persistent drives' flags),
//! `attach` (attach, detach), `stats` (stats, info), `caches`, `dirs`,
//! `tls` (tls reload), `token` (API tokens, `--host`), `bench` (the
//! benchmark: the one file that imports the `bench` engine, a seam), `dashboard` (the web UI's link), `units` (install-units), `docs` (man, completions), `daemon`; `output`
//! renders tables.
//!
//! Exit codes: 0 success, 1 the operation failed (including "daemon not
//! running"), 2 usage error: clap's own, and values the command line can
//! check itself (a size that does not parse, a name outside the naming
//! rule) through the `arg_*` value parsers below, before any request.
//!
//! Every command but `daemon` restores the default SIGPIPE action, so
//! `ramd list | head` ends quietly like other Unix tools instead of
//! panicking on a closed stdout. The daemon keeps SIGPIPE ignored (its
//! sockets and stderr must never kill it).

pub mod attach;
pub mod bench;
pub mod caches;
pub mod daemon;
pub mod dashboard;
pub mod dirs;
pub mod docs;
pub mod drives;
pub mod output;
pub mod persist;
pub mod remote;
pub mod snapshot;
pub mod stats;
pub mod tls;
pub mod token;
pub mod units;
pub mod upgrade;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::api::client::{Client, ClientError, Target};
use crate::api::wire::persistence::RestoreRequest;
use daemon::DaemonArgs;

/// RAM drives served over NBD: create, resize, lock and delete them at run
/// time, attach them as files, and watch them.
///
/// Start the daemon (serves a 1 GiB drive "ram0" by default):
///   ramd daemon
/// Then, in another shell:
///   ramd list                          drives, sizes, memory, URIs
///   ramd create db --size 4G           a new drive, served at once
///   uri=$(ramd info db | awk '$1 == "uri" {print $2}')
///   nbdinfo "$uri"                     its NBD URI: the socket is in the
///                                      runtime dir ($XDG_RUNTIME_DIR/ramd,
///                                      else /run/ramd for root, else
///                                      /tmp/ramd-UID)
///   mkdir -p /mnt/db && ramd attach db /mnt/db   (then losetup /mnt/db/db)
///   ramd stats --watch                 IOPS, MiB/s, latency, memory
///   ramd cache create c --backing /dev/sdb --size 2G --mode writeback
///                                      a RAM cache in front of a slow disk
///   ramd dir add ~/.cache              keep a directory in RAM, synced to disk
///
/// Docs: docs/cli.md, docs/api.md, docs/config.md, docs/attach.md.
#[derive(Parser, Debug)]
#[command(name = "ramd", version, propagate_version = true, verbatim_doc_comment)]
pub struct Cli {
    /// The daemon's API socket [default: $XDG_RUNTIME_DIR/ramd/api.sock, or
    /// /run/ramd/api.sock for root, else /tmp/ramd-UID/api.sock].
    #[arg(long, global = true, env = "RAMD_API_SOCKET", value_name = "PATH")]
    pub api_socket: Option<PathBuf>,

    /// Talk to a daemon's API over TCP instead (its --api-listen), e.g.
    /// https://db1:8443; needs a token (--token-file or RAMD_TOKEN).
    #[arg(long, global = true, env = "RAMD_HOST", value_name = "URL")]
    pub host: Option<String>,

    /// With --host: a file holding the bearer token (`ramd token create`)
    /// [env RAMD_TOKEN holds the token itself when no file is given].
    #[arg(long, global = true, env = "RAMD_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// With --host: the CA certificate (PEM) that signed the daemon's
    /// certificate [default: the system's trusted CAs].
    #[arg(long, global = true, env = "RAMD_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// `--json` for commands that print data.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct JsonFlag {
    /// Print JSON (the API's answer) instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon in the foreground: drives, NBD listeners, REST API.
    ///
    /// Examples:
    ///   ramd daemon                                # one 1 GiB drive "ram0"
    ///   ramd daemon --drive db=4G --drive tmp=512M,mem-limit=256M
    ///   ramd daemon --config /etc/ramd/ramd.toml --nbd-listen 127.0.0.1:10809
    ///
    /// Stops cleanly on SIGTERM/SIGINT: requests already received are
    /// answered, then connections close. Under systemd (Type=notify) it
    /// reports READY=1 and STOPPING=1.
    #[command(visible_alias = "serve", verbatim_doc_comment)]
    Daemon(DaemonArgs),

    /// Create a drive and serve it at once.
    ///
    /// Examples:
    ///   ramd create db --size 4G --mem-limit 2G
    ///   ramd create db --size 4G --persist --durability flush
    ///   ramd create vault --size 1G --persist --encrypt --key-file /etc/ramd/vault.key
    ///
    /// --persist keeps the drive in the daemon's state directory
    /// (STATE_DIR/drives/NAME); when that already holds the drive, it is
    /// restored (with a progress bar) instead of created, --size may be
    /// left out, and the settings stored with it (durability, interval,
    /// key file, memory limit) are kept unless given here (it says which). Durability: none (saved by `ramd sync` and clean shutdown
    /// only; FLUSH is a no-op), periodic (a whole point-in-time image at most
    /// one interval old), flush (periodic, and an acknowledged FLUSH/FUA means
    /// every earlier write is on disk). See docs/persistence.md.
    #[command(verbatim_doc_comment)]
    Create {
        /// Drive name: 1-64 of a-z 0-9 _ -, starting with a letter or digit.
        #[arg(value_parser = arg_name)]
        name: String,
        /// Size: 512, 4K, 1.5G, 2GiB (binary units).
        #[arg(long, value_name = "SIZE", required_unless_present = "persist", value_parser = arg_drive_size)]
        size: Option<String>,
        /// Most memory the drive may hold; writes past it fail with ENOSPC.
        #[arg(long, value_name = "SIZE", value_parser = arg_mem_limit)]
        mem_limit: Option<String>,
        /// Keep pages compressed: lz4, zstd, zstd:LEVEL, lz4+zstd[:LEVEL]
        /// (writes at lz4's speed, idle pages recompressed with zstd in
        /// the background) or off (default).
        /// The drive is promised min(size, mem-limit) of the budget, so
        /// give --mem-limit below --size to hold more than its memory.
        /// With --persist, the state directory holds raw pages (a restart
        /// restores it compressed). See docs/compression.md.
        #[arg(long, value_name = "ALGO")]
        compress: Option<String>,
        /// Refuse writes from the start (unlock with `ramd unlock`).
        #[arg(long)]
        read_only: bool,
        /// Allow a size beyond what the memory budget has left (writes
        /// past the budget then fail with ENOSPC).
        #[arg(long)]
        overcommit: bool,
        /// Lock the drive's memory in RAM as it is written, so it is never
        /// swapped (fast, and its data never reaches the swap device). The
        /// daemon needs RLIMIT_MEMLOCK for it (a raw drive counts its whole
        /// size, a compressed one min(size, mem-limit)): `ulimit -l`,
        /// LimitMEMLOCK= in a systemd unit, or CAP_IPC_LOCK.
        #[arg(long)]
        lock_memory: bool,
        #[command(flatten)]
        persist: persist::PersistArgs,
        #[command(flatten)]
        access: drives::AccessArgs,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Save a persistent drive now, or write a cache's dirty data back to
    /// its backing and flush it; returns once it is durable.
    ///
    /// Prints what was saved and how long it took. Works in every
    /// durability mode (it is how `none` drives are saved).
    Sync {
        #[arg(value_parser = arg_name)]
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Restore a persistent drive that failed to restore (corrupt image,
    /// meta or journal, wrong key), deciding what to do with the damage.
    ///
    /// Without options it tries again as it is (after you fixed the cause,
    /// e.g. the key file). Nothing on disk changes until a restore succeeds.
    #[command(verbatim_doc_comment)]
    Restore {
        #[arg(value_parser = arg_name)]
        name: String,
        /// Load despite damage: corrupt image pages as they are (zero when
        /// encrypted; the next sync rewrites them), the journal up to its
        /// damage (later generations are dropped).
        #[arg(long, conflicts_with = "discard_journal")]
        force: bool,
        /// Ignore the journal: load the image as of its last checkpoint and
        /// empty the journal (the syncs since then are lost).
        #[arg(long)]
        discard_journal: bool,
        /// Use this key file from now on (an encrypted drive). With
        /// --from --persist --encrypt: the new drive's key.
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,
        /// Return at once instead of waiting with a progress bar.
        #[arg(long)]
        no_wait: bool,
        /// Restore a snapshot from this remote into a new drive instead
        /// (served once every chunk is verified): `ramd restore db --from s3`.
        #[arg(long, value_name = "REMOTE", conflicts_with_all = ["force", "discard_journal"])]
        from: Option<String>,
        /// With --from: this snapshot (`ramd snapshot list`) [default: the newest].
        #[arg(long, value_name = "ID", requires = "from")]
        snapshot: Option<String>,
        /// With --from: the new drive's name [default: NAME].
        #[arg(long = "as", value_name = "NEWNAME", requires = "from", value_parser = arg_name)]
        as_name: Option<String>,
        /// With --from: make the new drive persistent (STATE_DIR/drives/NAME,
        /// which must hold no drive). It is served only once its state
        /// directory holds the whole snapshot, durably: a crash or a full
        /// disk during the restore leaves no drive behind.
        #[arg(long, requires = "from")]
        persist: bool,
        /// With --from --persist: none | periodic | flush [default: periodic].
        #[arg(long, value_name = "MODE", requires = "persist")]
        durability: Option<String>,
        /// With --from --persist: time between background syncs [default: 60s].
        #[arg(long, value_name = "DURATION", requires = "persist")]
        sync_interval: Option<String>,
        /// With --from --persist: encrypt the state directory with --key-file.
        #[arg(long, requires_all = ["persist", "key_file"])]
        encrypt: bool,
        /// With --from: keep the new drive's pages compressed (lz4, zstd,
        /// zstd:LEVEL, lz4+zstd[:LEVEL]; see `ramd create --compress`).
        #[arg(long, value_name = "ALGO", requires = "from")]
        compress: Option<String>,
        /// With --from: the new drive's memory limit [default: none]. A
        /// snapshot that does not fit it compressed fails, keeping nothing.
        #[arg(long, value_name = "SIZE", requires = "from", value_parser = arg_mem_limit)]
        mem_limit: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// List drives: size, memory used, limit, mode, connections, URI.
    List {
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Show one drive (or cache) in detail, or the daemon when no name is
    /// given.
    Info {
        #[arg(value_parser = arg_name)]
        name: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// IOPS, MiB/s, p50/p99 latency (last second) and memory per drive.
    Stats {
        /// Only this drive.
        #[arg(value_parser = arg_name)]
        name: Option<String>,
        /// Refresh once a second until Ctrl-C.
        #[arg(long)]
        watch: bool,
        /// With --watch: stop after N refreshes.
        #[arg(long, value_name = "N", requires = "watch")]
        count: Option<u64>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Grow or shrink a drive. Shrinking below stored data needs --force.
    ///
    /// NBD clients see the new size when they reconnect.
    Resize {
        #[arg(value_parser = arg_name)]
        name: String,
        /// New size: 512, 4K, 1.5G, 2GiB.
        #[arg(value_parser = arg_drive_size)]
        size: String,
        /// Shrink even when it discards data beyond the new end.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Make a drive read-only (open connections too, at once).
    Lock {
        #[arg(value_parser = arg_name)]
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Make a read-only drive writable again.
    Unlock {
        #[arg(value_parser = arg_name)]
        name: String,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Show or set who may see a drive or cache over NBD and NVMe/TCP
    /// (docs/tls.md).
    ///
    /// Examples:
    ///   ramd access db                                   # show the rules
    ///   ramd access db --allow-identity alice --read-only-identity bob
    ///   ramd access db --allow-network 10.0.0.0/8 --allow-network unix
    ///   ramd access db --open                            # no rules
    ///
    /// NAME is a drive or a cache; it gets exactly the rules given (a list
    /// not given becomes empty). New connections see them at once; open
    /// connections the new rules no longer allow what they negotiated are
    /// closed after their pending requests, the others keep what they have.
    #[command(verbatim_doc_comment)]
    Access(drives::AccessCommand),

    /// Delete a drive and free its memory.
    ///
    /// A drive with open NBD connections or attachments is refused unless
    /// --force, which closes the connections (after their pending
    /// requests) and detaches it first. A persistent drive's saved data is
    /// removed too, unless --keep-data (which saves its last writes first;
    /// create it again with --persist to restore it).
    Delete {
        #[arg(value_parser = arg_name)]
        name: String,
        #[arg(long)]
        force: bool,
        /// Persistent drives: save the last writes and keep the state
        /// directory.
        #[arg(long)]
        keep_data: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// RAM caches in front of slower disks (files, block devices, NBD
    /// exports): create, list, info, sync, delete.
    #[command(subcommand)]
    Cache(caches::CacheCommand),

    /// Expose a drive (or a cache) as a file MOUNTPOINT/NAME through FUSE,
    /// or with --ublk as a block device /dev/ublkbN.
    ///
    /// Then: dev=$(losetup -f --show --direct-io=on MOUNTPOINT/NAME); mkfs.ext4 $dev;
    /// mount $dev /mnt/data. Undo with `ramd detach MOUNTPOINT` after
    /// umount and losetup -d. With --ublk: mkfs.ext4 /dev/ublkbN directly;
    /// undo with `ramd detach NAME` after umount. See docs/attach.md.
    #[command(verbatim_doc_comment)]
    Attach {
        /// The drive.
        #[arg(required_unless_present = "list", value_parser = arg_name)]
        name: Option<String>,
        /// An existing, empty directory that is not a mount point (never /).
        #[arg(required_unless_present_any = ["list", "ublk"])]
        mountpoint: Option<PathBuf>,
        /// A block device /dev/ublkbN (the kernel's ublk_drv) instead of a
        /// FUSE file; it survives a ramd crash (persistent drives).
        #[arg(long, conflicts_with_all = ["mountpoint", "list"])]
        ublk: bool,
        /// Attach over a non-empty directory or a mount point anyway: what
        /// is there stays hidden until detach.
        #[arg(long, conflicts_with = "list")]
        force: bool,
        /// List attachments instead.
        #[arg(long, conflicts_with_all = ["name", "mountpoint"])]
        list: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Undo `ramd attach`: unmount the FUSE file (MOUNTPOINT), or remove
    /// the ublk device (the drive's NAME or /dev/ublkbN).
    Detach {
        /// The FUSE mountpoint, or the drive's name or device for ublk.
        mountpoint: PathBuf,
        /// ublk: remove the device even while it is mounted or open (I/O
        /// on it then fails).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Directories kept in RAM (tmpfs or overlay over them), synced back to
    /// disk crash-safely: add, list, info, sync, remove.
    #[command(subcommand)]
    Dir(dirs::DirCommand),

    /// The NBD server's TLS certificates: reload them without dropping
    /// connections.
    #[command(subcommand)]
    Tls(tls::TlsCommand),

    /// Object storage for drive snapshots: add, list, remove (docs/snapshots.md).
    #[command(subcommand)]
    Remote(remote::RemoteCommand),

    /// Drive snapshots in object storage: create, list, delete, prune,
    /// status; restore with `ramd restore DRIVE --from REMOTE`.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),

    /// Bearer tokens for the API over TCP (ramd daemon --api-listen):
    /// create, list, revoke. Through the unix socket only.
    #[command(subcommand)]
    Token(token::TokenCommand),

    /// Hand every drive, ublk device and client of a supervised daemon
    /// (ramd daemon --supervise) to another ramd binary, without losing
    /// data: the serving process stops, the supervisor starts the new
    /// binary with every RAM drive's memory; if the new one fails before it
    /// serves, the old one is started again (and this command exits 1 with
    /// the reason). Through the unix socket only.
    ///
    /// Examples:
    ///   ramd upgrade                            # the binary at this ramd's path (after a package upgrade)
    ///   ramd upgrade --binary /opt/ramd/bin/ramd
    #[command(verbatim_doc_comment)]
    Upgrade {
        /// The new binary [default: the path the daemon was started from].
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        #[command(flatten)]
        out: JsonFlag,
    },

    /// Print a one-time sign-in link to the web dashboard (ramd daemon
    /// --http ADDR), as the last line.
    ///
    /// Examples:
    ///   ramd dashboard                  read-only: see everything
    ///   ramd dashboard --admin          also create/resize/delete drives, sync, snapshot
    ///   ramd dashboard --url-host db1.example.com
    ///
    /// Run it on the daemon's host as its user (it makes a token through
    /// the unix socket). The link works once, within 5 minutes: the
    /// browser that opens it gets a session for the token's life (7 days
    /// unless --expires); `ramd token revoke NAME` ends it. See
    /// docs/dashboard.md.
    #[command(verbatim_doc_comment)]
    Dashboard(dashboard::DashboardArgs),

    /// Measure a drive against the disks it replaces: IOPS, MiB/s and
    /// latency (fio's figures), a table with ratios, a plot.
    ///
    /// Examples:
    ///   ramd create bench --size 2G
    ///   ramd bench bench --compare /var/tmp              # the quick profile, < 1 min
    ///   ramd bench bench --compare /var/tmp --profile full --plot bench.svg
    ///   ramd bench --compare /mnt/ssd --compare /dev/shm --test randread-4k-qd1
    ///   ramd bench bench --json > results.json
    ///
    /// The drive must hold no data (or give --destructive); what the bench
    /// writes is trimmed afterwards. A directory gets a scratch file and
    /// directory inside, removed afterwards; a block device, a file holding
    /// data or a cache is written only with --destructive. Files are opened
    /// with O_DIRECT where the filesystem allows it; the table's notes say
    /// when the page cache is in play. The report of a run with a drive is
    /// kept by the daemon for the dashboard (GET /v1/bench/latest). Ctrl-C
    /// stops it and cleans up. See docs/bench.md.
    #[command(verbatim_doc_comment)]
    Bench(bench::BenchArgs),

    /// Install the systemd units (ramd.service, ramd-sleep.service and the
    /// shutdown-ordering drop-in for directories in RAM).
    ///
    /// Example: ramd install-units && systemctl daemon-reload &&
    ///          systemctl enable --now ramd.service ramd-sleep.service
    #[command(verbatim_doc_comment)]
    InstallUnits(units::InstallArgs),

    /// Print a shell completion script.
    ///
    /// Example: ramd completions bash > /etc/bash_completion.d/ramd
    Completions { shell: clap_complete::Shell },

    /// Print the man page (roff), or write one page per command into DIR.
    ///
    /// Examples: ramd man | man -l -
    ///           ramd man /usr/local/share/man/man1   (same as --dir DIR)
    #[command(verbatim_doc_comment)]
    Man {
        /// Write one page per command into DIR (ramd.1, ramd-create.1, ...).
        #[arg(value_name = "DIR", conflicts_with = "dir")]
        into: Option<PathBuf>,
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Why a command failed (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Daemon(#[from] daemon::DaemonError),
    /// `--host`, its token or its CA cannot be used.
    #[error(transparent)]
    Host(#[from] token::HostArgsError),
    /// The default runtime directory is not safely this user's.
    #[error("refusing the default runtime directory: {0}. Another user may be impersonating the daemon there")]
    UntrustedRuntimeDir(#[source] crate::paths::DirError),
    /// A path given on the command line could not be made absolute.
    #[error("{}: {source}", path.display())]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `ramd detach MOUNTPOINT` where nothing is attached.
    #[error("nothing is attached at {} (see `ramd attach --list`)", .0.display())]
    NotAttached(PathBuf),
    /// A persistent drive whose restore failed: what to do next.
    #[error("drive '{name}' failed to restore: {reason}\n  nothing was changed on disk; decide with `ramd restore {name} --force` or `ramd restore {name} --discard-journal` (see `ramd restore --help`), or `ramd delete {name}`")]
    RestoreFailed { name: String, reason: String },
    /// `ramd install-units` without --bin, when this binary's path is unknown.
    #[error("cannot find this binary's path: {0}; give it with --bin")]
    NoBinaryPath(#[source] std::io::Error),
    /// `ramd install-units` for a binary in a build tree, without --bin.
    #[error(transparent)]
    BuildTree(#[from] units::InBuildTree),
    /// A file `ramd install-units` or `ramd man` writes.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the man page: {0}")]
    ManPage(#[source] std::io::Error),
    /// JSON output that could not be encoded.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// `ramd dir add PATH` where PATH is no directory that exists.
    #[error("{}: {source} (ramd keeps an existing directory in RAM)", path.display())]
    NoDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// `ramd dir set` without anything to change.
    #[error("nothing to change: give --interval, --size-limit or --recovery-generations")]
    NothingToChange,
    /// `ramd dir sync` (all) where some directories failed.
    #[error("{failed} of {total} directories failed to sync (see above)")]
    DirsFailedToSync { failed: usize, total: usize },
    /// A snapshot push or restore failed in the daemon.
    #[error(transparent)]
    SnapshotJob(#[from] snapshot::JobFailed),
    /// `ramd bench` failed or refused a target.
    #[error(transparent)]
    Bench(#[from] bench::BenchFailed),
    /// `ramd upgrade` did not end with the new binary serving.
    #[error(transparent)]
    Upgrade(#[from] upgrade::UpgradeFailed),
}

/// A value the command line refuses before any request (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    /// A drive name, size or memory limit the daemon's rules refuse.
    #[error(transparent)]
    Spec(#[from] daemon::SpecError),
    /// A cache name outside the naming rule (the same as for drives).
    #[error("invalid cache name '{0}': use 1-64 of a-z 0-9 _ -, starting with a letter or digit")]
    CacheName(String),
    /// A size that does not parse.
    #[error(transparent)]
    Size(#[from] crate::size::SizeError),
}

/// Parses the command line and runs it; the process exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help/--version print to stdout and exit 0; usage errors 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if !matches!(cli.command, Command::Daemon(_)) {
        default_sigpipe();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!: it panics when stderr is a dead pipe, and the
            // exit code must say what happened, not that printing failed.
            let _ = writeln!(std::io::stderr(), "ramd: {}", terminal_safe(&e.to_string()));
            ExitCode::from(1)
        }
    }
}

/// `text` with its control characters shown as `\u{..}` escapes (line
/// breaks and tabs kept): an error may carry text from a remote server (an
/// S3 error body, an NBD backing's message), which must not drive the
/// user's terminal (escape sequences can rewrite what the screen shows).
pub(crate) fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Restores the default SIGPIPE action (Rust ignores it): a client whose
/// reader went away (`ramd list | head`) ends quietly, as Unix tools do.
fn default_sigpipe() {
    // SAFETY: signal(2) with SIG_DFL takes no pointers; called before any
    // thread starts, and only in client commands.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// A drive or cache name argument: the naming rule, checked before any
/// request (a bad name is a usage error, exit 2).
pub(crate) fn arg_name(text: &str) -> Result<String, ArgError> {
    daemon::check_name(text)?;
    Ok(text.to_owned())
}

/// A cache name argument (the same rule as drives).
pub(crate) fn arg_cache_name(text: &str) -> Result<String, ArgError> {
    arg_name(text).map_err(|_| ArgError::CacheName(text.to_owned()))
}

/// A size argument that must parse (`512`, `4K`, `1.5G`, `2 GiB`); the
/// text is sent as given.
pub(crate) fn arg_size(text: &str) -> Result<String, ArgError> {
    crate::size::parse(text)?;
    Ok(text.to_owned())
}

/// A drive size argument: a size of at least 1 byte.
pub(crate) fn arg_drive_size(text: &str) -> Result<String, ArgError> {
    daemon::check_drive_size(text)?;
    Ok(text.to_owned())
}

/// A memory limit argument: a size of at least 1 byte, or `none`.
pub(crate) fn arg_mem_limit(text: &str) -> Result<String, ArgError> {
    if !matches!(text.trim(), "none" | "unlimited") {
        daemon::check_mem_limit(text)?;
    }
    Ok(text.to_owned())
}

pub(crate) fn notice(n: &Option<String>) {
    if let Some(n) = n {
        eprintln!("note: {n}");
    }
}

pub(crate) fn print_json<T: Serialize>(v: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(v)?;
    println!("{text}");
    Ok(())
}

/// An absolute path for the daemon (which has its own working directory).
pub(crate) fn absolute(path: &std::path::Path) -> Result<PathBuf, CliError> {
    std::path::absolute(path).map_err(|source| CliError::Path {
        path: path.to_owned(),
        source,
    })
}

/// [`absolute`] as the text a request carries.
pub(crate) fn absolute_text(path: Option<&std::path::Path>) -> Result<Option<String>, CliError> {
    path.map(|p| absolute(p).map(|a| a.display().to_string()))
        .transpose()
}

/// Where the command's daemon is: `--host` (with its token and CA) for
/// client commands that name one, else the API socket.
fn target(cli: &Cli) -> Result<Target, CliError> {
    let socket = cli
        .api_socket
        .clone()
        .unwrap_or_else(crate::paths::api_socket);
    if matches!(
        cli.command,
        Command::Daemon(_) | Command::Completions { .. } | Command::Man { .. }
    ) {
        return Ok(Target::Unix(socket));
    }
    // The default socket's directory has a guessable name: trust it only
    // as the daemon would (a socket named explicitly is the user's call).
    if cli.api_socket.is_none() && cli.host.is_none() {
        crate::paths::check_client_runtime_dir(&crate::paths::runtime_dir())
            .map_err(CliError::UntrustedRuntimeDir)?;
    }
    Ok(token::target(
        socket,
        cli.host.as_deref(),
        cli.token_file.as_deref(),
        cli.ca_cert.as_deref(),
    )?)
}

/// `ramd daemon`, with the global `--api-socket` when it has none.
fn run_daemon(mut args: DaemonArgs, api_socket: Option<PathBuf>) -> Result<(), CliError> {
    if args.api_socket.is_none() {
        args.api_socket = api_socket;
    }
    Ok(daemon::run(args)?)
}

/// Runs a parsed command.
/// `ramd restore`: a persistent drive's restore, or (`--from`) a
/// snapshot into a new drive.
fn restore(client: &Client, c: Command) -> Result<(), CliError> {
    let Command::Restore {
        name,
        force,
        discard_journal,
        key_file,
        no_wait,
        from,
        snapshot,
        as_name,
        persist,
        durability,
        sync_interval,
        encrypt,
        compress,
        mem_limit,
        out,
    } = c
    else {
        unreachable!("restore() is called with Command::Restore");
    };
    if let Some(remote) = from {
        let req = crate::api::wire::snapshots::RestoreSnapshot {
            remote,
            drive: name,
            snapshot,
            as_name,
            persist,
            durability,
            sync_interval: sync_interval.map(crate::api::wire::values::DurationValue::Text),
            encrypt,
            key_file: absolute_text(key_file.as_deref())?,
            compress,
            mem_limit: mem_limit.map(crate::api::wire::values::SizeValue::Text),
        };
        return snapshot::restore_from(client, &req, no_wait, out.json);
    }
    let req = RestoreRequest {
        force,
        discard_journal,
        key_file: absolute_text(key_file.as_deref())?,
    };
    persist::restore(client, &name, &req, out.json, no_wait)
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    let target = target(&cli)?;
    let client = || Client::to(target.clone());
    match cli.command {
        Command::Daemon(args) => run_daemon(args, cli.api_socket.clone())?,
        Command::Create {
            name,
            size,
            mem_limit,
            compress,
            read_only,
            overcommit,
            lock_memory,
            persist,
            access,
            out,
        } => {
            let args = drives::CreateArgs {
                name,
                size,
                mem_limit,
                compress,
                read_only,
                overcommit,
                lock_memory,
                persist,
                access,
                json: out.json,
            };
            drives::create_from(&client(), args)?
        }
        Command::List { out } => drives::list(&client(), out.json)?,
        Command::Info { name, out } => stats::info(&client(), name.as_deref(), out.json)?,
        Command::Stats {
            name,
            watch,
            count,
            out,
        } => stats::stats(&client(), name.as_deref(), watch, count, out.json)?,
        Command::Resize {
            name,
            size,
            force,
            out,
        } => drives::resize(&client(), &name, &size, force, out.json)?,
        Command::Lock { name, out } => drives::set_read_only(&client(), &name, true, out.json)?,
        Command::Unlock { name, out } => drives::set_read_only(&client(), &name, false, out.json)?,
        Command::Access(a) => drives::access(&client(), a)?,
        Command::Delete {
            name,
            force,
            keep_data,
            out,
        } => drives::delete(&client(), &name, force, keep_data, out.json)?,
        Command::Attach {
            name,
            mountpoint,
            force,
            ublk,
            list,
            out,
        } => match (name, mountpoint) {
            (Some(name), None) if ublk => attach::attach_ublk(&client(), name, out.json)?,
            (Some(name), Some(mp)) if !list => {
                attach::attach(&client(), name, &mp, force, out.json)?
            }
            _ => attach::attach_list(&client(), out.json)?,
        },
        Command::Detach {
            mountpoint,
            force,
            out,
        } => attach::detach(&client(), &mountpoint, force, out.json)?,
        Command::Cache(cmd) => caches::run(&client(), cmd)?,
        Command::Sync { name, out } => {
            // A cache's name syncs the cache; else the drive's.
            if !caches::sync_if_cache(&client(), &name, out.json)? {
                persist::sync(&client(), &name, out.json)?
            }
        }
        c @ Command::Restore { .. } => restore(&client(), c)?,
        Command::Dir(cmd) => dirs::run(&client(), cmd)?,
        Command::Tls(cmd) => tls::run(&client(), cmd)?,
        Command::Remote(cmd) => remote::run(&client(), cmd)?,
        Command::Snapshot(cmd) => snapshot::run(&client(), cmd)?,
        Command::Token(cmd) => token::run(&client(), cmd)?,
        Command::Upgrade { binary, out } => {
            upgrade::run(&client(), absolute_text(binary.as_deref())?, out.json)?
        }
        Command::Bench(args) => bench::run(&client(), args)?,
        Command::Dashboard(args) => dashboard::run(&client(), args)?,
        Command::InstallUnits(args) => units::run(&client(), args)?,
        Command::Completions { shell } => docs::completions(shell),
        Command::Man { into, dir } => docs::man(into.or(dir))?,
    }
    Ok(())
}

#[cfg(test)]
mod terminal_tests {
    #[test]
    fn remote_text_cannot_drive_the_terminal() {
        let evil = "S3 said: \x1b]0;owned\x07\x1b[2J<Error>\r\nline\tok";
        let safe = super::terminal_safe(evil);
        assert!(
            !safe
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{safe:?}"
        );
        assert!(safe.contains("\\u{1b}]0;owned\\u{7}"), "{safe}");
        assert!(safe.ends_with("\nline\tok"), "{safe}");
    }
}
