//! A single-node Garage (S3-compatible object store) on loopback, for the
//! snapshot engine's tests: its own temp directory, sqlite metadata,
//! replication factor 1, random free ports; a layout, one key and one
//! bucket made with the `garage` CLI. Stoppable and restartable on the
//! same ports and data (to test a remote that goes down); killed on drop.
//!
//! The binary comes from `cargo install garage` (scripts/test-deps.sh):
//! found on PATH or in ~/.cargo/bin.

use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{
    prerequisite_missing, run, tool, try_run, wait_timeout, wait_until, Daemon, KillOnDrop, Output,
};

/// How long Garage may take to come up (it is quick; the machine may not be).
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Garage {
    dir: tempfile::TempDir,
    bin: PathBuf,
    config: PathBuf,
    child: Option<KillOnDrop>,
    /// `http://127.0.0.1:PORT` of the S3 API.
    pub endpoint: String,
    /// The S3 region Garage answers to.
    pub region: String,
    /// The access key's id and secret.
    pub key_id: String,
    pub secret: String,
    /// The bucket the key may read, write and own.
    pub bucket: String,
}

/// The garage binary: on PATH, else in ~/.cargo/bin.
pub fn find_garage() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("garage"));
    let cargo = std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo/bin/garage"));
    on_path.chain(cargo).find(|p| p.is_file())
}

/// Three distinct free loopback ports (all bound at once while chosen).
fn free_ports() -> (u16, u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    let held = [bind(), bind(), bind()];
    let port = |i: usize| held[i].local_addr().expect("a bound address").port();
    (port(0), port(1), port(2))
}

/// 32 random bytes as hex (the RPC secret) from the system generator.
fn random_hex32() -> String {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("read /dev/urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The value after `label` on the line that starts with it.
fn field(out: &str, label: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .map(|v| v.trim().to_owned())
}

impl Garage {
    /// Starts Garage and makes a key and a bucket; None when the binary is
    /// missing and RAMD_SKIP_MISSING_TOOLS=1 (else the test fails).
    #[track_caller]
    pub fn start() -> Option<Garage> {
        let Some(bin) = find_garage() else {
            prerequisite_missing(
                "missing tool garage: install with cargo install garage --locked --no-default-features --features sqlite,bundled-libs",
            );
            return None;
        };
        let dir = tempfile::Builder::new()
            .prefix("ramd-garage-")
            .tempdir()
            .unwrap();
        let config = dir.path().join("garage.toml");
        let mut g = Garage {
            dir,
            bin,
            config,
            child: None,
            endpoint: String::new(),
            region: "garage".into(),
            key_id: String::new(),
            secret: String::new(),
            bucket: "ramd-test".into(),
        };
        // A port picked free may be taken by another test before Garage
        // binds it (the tests run in parallel): new ports, a few times.
        let mut attempt = 0;
        while let Err(why) = g.new_ports_and_launch() {
            attempt += 1;
            assert!(
                attempt < 4 && why.contains("in use"),
                "garage did not start: {why}"
            );
            eprintln!("garage: a port was taken, starting again on new ports");
        }
        let node = g.cli(&["node", "id", "-q"]);
        let node = node.trim().split('@').next().unwrap().to_owned();
        g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &node]);
        g.cli(&["layout", "apply", "--version", "1"]);
        let key = g.cli(&["key", "create", "ramd-test-key"]);
        g.key_id = field(&key, "Key ID:").unwrap_or_else(|| panic!("no key id in:\n{key}"));
        g.secret =
            field(&key, "Secret key:").unwrap_or_else(|| panic!("no secret in garage's output"));
        let bucket = g.bucket.clone();
        g.cli(&["bucket", "create", &bucket]);
        g.cli(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            &bucket,
            "--key",
            "ramd-test-key",
        ]);
        Some(g)
    }

    /// Runs `garage -c CONFIG ARGS`, panicking unless it succeeds; its
    /// stdout. (Output may hold the secret key: never printed on success.)
    #[track_caller]
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.try_cli(args);
        assert!(
            out.status.success(),
            "garage {} failed: {}\n{}",
            args.join(" "),
            out.stderr,
            out.stdout
        );
        out.stdout
    }

    fn try_cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("-c").arg(&self.config).args(args);
        try_run(&mut cmd, START_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Kills the server (data stays) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.0.kill();
            wait_timeout(&mut c.0, Duration::from_secs(10)).expect("garage exits after SIGKILL");
        }
    }

    /// Writes the config with fresh free ports (and a new RPC secret),
    /// then [`Garage::launch`]es.
    fn new_ports_and_launch(&mut self) -> Result<(), String> {
        let (rpc, s3, admin) = free_ports();
        let d = self.dir.path().display();
        std::fs::write(
            &self.config,
            format!(
                r#"metadata_dir = "{d}/meta"
data_dir = "{d}/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
"#,
                secret = random_hex32()
            ),
        )
        .unwrap();
        self.endpoint = format!("http://127.0.0.1:{s3}");
        self.launch()
    }

    /// Starts (again) on the same ports and data; returns once the S3 port
    /// accepts connections and the node answers `garage status`.
    #[track_caller]
    pub fn restart(&mut self) {
        if let Err(why) = self.launch() {
            panic!("garage did not start again: {why}");
        }
    }

    /// Starts the server and waits until it serves, or says why not (its
    /// log, which names a port already in use).
    fn launch(&mut self) -> Result<(), String> {
        self.stop();
        let log = std::fs::File::create(self.dir.path().join("garage.log")).unwrap();
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config)
            .arg("server")
            .env("RUST_LOG", "garage=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start garage server");
        self.child = Some(KillOnDrop(child));
        let s3 = self.endpoint.trim_start_matches("http://").to_owned();
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        let mut status = String::new();
        loop {
            if let Some(c) = &mut self.child {
                if let Ok(Some(exit)) = c.0.try_wait() {
                    return Err(format!("garage exited ({exit}); its log:\n{}", self.log()));
                }
            }
            if self.log().contains("in use") {
                return Err(format!("its log:\n{}", self.log()));
            }
            if TcpStream::connect(&s3).is_ok() {
                // Bounded: a status call that hangs is retried.
                let mut cmd = Command::new(&self.bin);
                cmd.arg("-c").arg(&self.config).arg("status");
                match try_run(&mut cmd, Duration::from_secs(10)) {
                    Ok(out) if out.status.success() => return Ok(()),
                    Ok(out) => status = out.stderr,
                    Err(e) => status = e.to_string(),
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "not serving after {START_TIMEOUT:?} (S3 on {s3}; garage status said: {status}); its log:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("garage.log")).unwrap_or_default()
    }

    /// `curl` with SigV4 against the bucket: `method` on `key` (under the
    /// bucket), the body from `upload` when given; the response body goes
    /// to `output`. For tests that go around ramd (an object replaced).
    #[track_caller]
    pub fn s3_curl(&self, method: &str, key: &str, upload: Option<&Path>, output: &Path) {
        // The key pair in a config file, not on the command line (which a
        // failing run prints).
        let auth = self.dir.path().join("curl-auth");
        std::fs::write(
            &auth,
            format!("user = \"{}:{}\"\n", self.key_id, self.secret),
        )
        .unwrap();
        std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut cmd = tool("curl");
        cmd.args(["-sS", "--fail", "-X", method])
            .arg("-K")
            .arg(&auth)
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
            .args(["--aws-sigv4", &format!("aws:amz:{}:s3", self.region)])
            .arg("-o")
            .arg(output);
        if let Some(f) = upload {
            cmd.arg("--data-binary").arg(format!("@{}", f.display()));
        }
        cmd.arg(format!("{}/{}/{key}", self.endpoint, self.bucket));
        run(&mut cmd).ok();
    }

    /// Every file under the data directory (where Garage keeps object
    /// data as content-addressed blocks; small objects live in the
    /// metadata database instead).
    pub fn data_files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.dir.path().join("data"), &mut out);
        out.sort();
        out
    }
}

// ---------------------------------------------------------------------
// Helpers of the daemon-level snapshot tests (tests/snapshot_*.rs): a
// remote for this Garage, the CLI with its output checked to hold no
// secret, nbdcopy in and out of drives, jobs followed to their end.
// (The steps built on these are in snapshots.rs.)

/// One test at a time: each runs a Garage and daemons moving hundreds of
/// MiB, and two at once on a small machine make Garage answer 503.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A credentials file (0600) for the Garage key; `secret` overrides it.
pub fn creds_file(dir: &Path, g: &Garage, secret: Option<&str>) -> PathBuf {
    let path = dir.join(format!("creds-{}.toml", secret.map_or("ok", |_| "bad")));
    std::fs::write(
        &path,
        format!(
            "access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            g.key_id,
            secret.unwrap_or(&g.secret)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `ramd ARGS` against `d`, with its output checked to hold no secret.
#[track_caller]
pub fn cli(d: &Daemon, g: &Garage, args: &[&str]) -> Output {
    let out = run(d.cli().args(args));
    assert!(
        !out.stdout.contains(&g.secret) && !out.stderr.contains(&g.secret),
        "the secret key appears in the output of ramd {args:?}"
    );
    out
}

/// `ramd remote add NAME s3://BUCKET/PREFIX` for Garage.
#[track_caller]
pub fn add_remote(d: &Daemon, g: &Garage, name: &str, bucket: &str, creds: &Path) {
    let url = format!("s3://{bucket}/ramd");
    cli(
        d,
        g,
        &[
            "remote",
            "add",
            name,
            &url,
            "--endpoint",
            &g.endpoint,
            "--region",
            &g.region,
            "--credentials-file",
            creds.to_str().unwrap(),
        ],
    )
    .ok();
}

/// Writes `data` at the start of drive `name` with nbdcopy.
#[track_caller]
pub fn write_drive(d: &Daemon, name: &str, data: &[u8]) {
    let file = d.dir().join(format!("in-{name}.img"));
    std::fs::write(&file, data).unwrap();
    run(tool("nbdcopy").arg(&file).arg(d.uri(name))).ok();
}

/// The whole drive `name`, read with nbdcopy.
#[track_caller]
pub fn read_drive(d: &Daemon, name: &str) -> Vec<u8> {
    let file = d.dir().join(format!("out-{name}.img"));
    run(tool("nbdcopy").arg(d.uri(name)).arg(&file)).ok();
    std::fs::read(&file).unwrap()
}

/// The JSON a `--json` command printed.
#[track_caller]
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Pushes `drive` to `remote` and waits; the job's JSON.
#[track_caller]
pub fn push(d: &Daemon, g: &Garage, drive: &str, remote: &str) -> serde_json::Value {
    let out = cli(
        d,
        g,
        &["snapshot", "create", drive, "--to", remote, "--json"],
    )
    .ok();
    let job = json(&out);
    assert_eq!(job["state"], "done", "{job}");
    job
}

/// `GET /v1/snapshots/jobs/ID`: the job's JSON.
#[track_caller]
pub fn job(d: &Daemon, id: u64) -> serde_json::Value {
    let (status, body) = d.http("GET", &format!("/v1/snapshots/jobs/{id}"), None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls a job until it is no longer running.
#[track_caller]
pub fn wait_job(d: &Daemon, id: u64) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    wait_until("the snapshot job to end", Duration::from_secs(300), || {
        last = job(d, id);
        last["state"] != "running"
    });
    last
}

/// Starts a push without waiting; the job's JSON (the cut is taken).
#[track_caller]
pub fn start_push(d: &Daemon, g: &Garage, drive: &str, remote: &str) -> serde_json::Value {
    let out = cli(
        d,
        g,
        &[
            "snapshot",
            "create",
            drive,
            "--to",
            remote,
            "--no-wait",
            "--json",
        ],
    )
    .ok();
    json(&out)
}

#[track_caller]
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: sizes differ");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}");
    }
}
