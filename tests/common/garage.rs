//! A single-node Garage (S3-compatible object store) on loopback, for the
//! snapshot engine's tests: its own temp directory, sqlite metadata,
//! replication factor 1, random free ports; a layout, one key and one
//! bucket made with the `garage` CLI. Stoppable and restartable on the
//! same ports and data (to test a remote that goes down); killed on drop.
//!
//! The binary comes from `cargo install garage` (scripts/test-deps.sh):
//! found on PATH or in ~/.cargo/bin.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{prerequisite_missing, try_run, wait_timeout, wait_until, KillOnDrop, Output};

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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
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
        let (rpc, s3, admin) = (free_port(), free_port(), free_port());
        let config = dir.path().join("garage.toml");
        let d = dir.path().display();
        std::fs::write(
            &config,
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
        let mut g = Garage {
            dir,
            bin,
            config,
            child: None,
            endpoint: format!("http://127.0.0.1:{s3}"),
            region: "garage".into(),
            key_id: String::new(),
            secret: String::new(),
            bucket: "ramd-test".into(),
        };
        g.restart();
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

    /// Starts (again) on the same ports and data; returns once the S3 port
    /// accepts connections and the node answers `garage status`.
    pub fn restart(&mut self) {
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
        wait_until("garage's S3 port", START_TIMEOUT, || {
            self.assert_running();
            TcpStream::connect(&s3).is_ok()
        });
        wait_until("garage status", START_TIMEOUT, || {
            self.try_cli(&["status"]).status.success()
        });
    }

    #[track_caller]
    fn assert_running(&mut self) {
        if let Some(c) = &mut self.child {
            if let Ok(Some(status)) = c.0.try_wait() {
                panic!("garage exited ({status}); its log:\n{}", self.log());
            }
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("garage.log")).unwrap_or_default()
    }
}
