//! A libnbd session held open in a Python child (Debian's `nbd` module):
//! the TLS tests check that it keeps working across certificate reloads.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

use super::{tool, KillOnDrop};

/// A libnbd session kept open in a Python child: each line on its stdin
/// writes and reads back a block.
pub struct PySession {
    child: KillOnDrop,
    lines: BufReader<std::process::ChildStdout>,
}

impl PySession {
    pub fn open(uri: &str) -> PySession {
        let script = "\
import nbd, sys, os
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.connect_uri(sys.argv[1])
print('connected', flush=True)
for n, _ in enumerate(sys.stdin):
    buf = os.urandom(4096)
    h.pwrite(buf, n * 4096)
    print('ok' if h.pread(4096, n * 4096) == buf else 'bad', flush=True)
";
        let mut child = tool("/usr/bin/python3")
            .args(["-c", script, uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "connected");
        PySession {
            child: KillOnDrop(child),
            lines,
        }
    }

    pub fn round_trip(&mut self) -> bool {
        let stdin = self.child.0.stdin.as_mut().unwrap();
        if stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .is_err()
        {
            return false;
        }
        let mut line = String::new();
        let _ = self.lines.read_line(&mut line);
        line.trim() == "ok"
    }
}
