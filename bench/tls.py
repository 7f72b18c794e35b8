#!/usr/bin/python3
"""NBD over TLS on loopback TCP, one run: ramd with TLS, nbdkit memory
--tls=require, qemu-nbd with tls-creds-x509, and ramd in plaintext, each
started here, the same fio workloads against each (bench/peers.py's
run_workload: IOPS, MiB/s, clat p50/p99/p99.9/max, server CPU per I/O),
then the handshake time: connect to the first reply of a 4 KiB read, over
HANDSHAKES fresh connections (libnbd's Python binding).

    /usr/bin/python3 bench/tls.py --ramd target/release/ramd \\
        --certs DIR --client-home HOME --out run.json

ramd is the daemon (`ramd daemon --drive ram0=DISK --nbd-listen ...`,
`--tls require` with the certificates, `--tls off` for the plaintext
figures), as a user runs it.

bench/tls.sh makes the certificates and runs this. Every TLS server asks
for and verifies a client certificate (mutual TLS): ramd by default when
its directory has a CA, nbdkit with --tls-verify-peer, qemu-nbd with
verify-peer=on. fio takes only a URI, and libnbd refuses tls-certificates=
there, so fio runs with HOME=--client-home (its .pki/libnbd holds the
client's files), as nobody when we are root (root's libnbd looks in
/etc/pki/libnbd instead).
"""
import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (run_workload, CLEAN, table, die_with_parent)

WORKLOADS = ["prefill", "randrw_4k_qd64x2", "seqread_1m_qd8", "seqwrite_1m_qd8",
             "randread_4k_qd1", "randwrite_4k_qd1"]
SERVERS = ["ramd-tls", "nbdkit-tls", "qemu-nbd-tls", "ramd-plain"]
EXPORT = "ram0"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def greets(port):
    """True once a server on the port sends the newstyle greeting (then the
    probe aborts politely)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            g = b""
            while len(g) < 18:
                c = s.recv(18 - len(g))
                if not c:
                    return False
                g += c
            s.sendall(b"\0\0\0\3" + b"IHAVEOPT" + (2).to_bytes(4, "big") + b"\0\0\0\0")
            return g[:16] == b"NBDMAGICIHAVEOPT"
    except OSError:
        return False


def server_argv(name, args, port, tmp, shm):
    certs, disk = args.certs, args.disk
    if name.startswith("ramd"):
        # Its sockets and state in a private directory (the daemon checks).
        own = tempfile.mkdtemp(prefix="ramd-tls-daemon-")
        peers.CLEAN.dirs.append(own)
        argv = [args.ramd, "daemon", "--no-config", "--no-default-drive",
                "--state-dir", os.path.join(own, "state"),
                "--socket", os.path.join(own, "nbd.sock"),
                "--api-socket", os.path.join(own, "api.sock"),
                "--drive", f"{EXPORT}={disk}", "--nbd-listen", f"127.0.0.1:{port}"]
        if name == "ramd-tls":
            argv += ["--tls-certificates", certs, "--tls", "require"]
        else:
            argv += ["--tls", "off"]
        return argv, None
    if name == "nbdkit-tls":
        if not shutil.which("nbdkit"):
            return None, "nbdkit not installed"
        return ["nbdkit", "-f", "--exit-with-parent", "-i", "127.0.0.1", "-p", str(port),
                "--tls=require", f"--tls-certificates={certs}", "--tls-verify-peer",
                "memory", disk, "allocator=sparse"], None
    if name == "qemu-nbd-tls":
        if not shutil.which("qemu-nbd"):
            return None, "qemu-nbd not installed"
        img = os.path.join(shm, "qemu-nbd.img")
        with open(img, "wb") as f:
            f.truncate(peers.parse_size(disk))
        return ["qemu-nbd", "-f", "raw", "-b", "127.0.0.1", "-p", str(port), "-x", EXPORT,
                "-t", "-e", "16", "--cache=writeback", "--aio=threads", "--discard=unmap",
                "--object", f"tls-creds-x509,id=tls0,endpoint=server,dir={certs},verify-peer=on",
                "--tls-creds", "tls0", img], None
    return None, f"unknown server {name}"


def start(name, argv, log):
    peers.say(f"  start: {shlex.join(argv)}")
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                start_new_session=True, preexec_fn=peers.die_with_parent)
    peers.CLEAN.groups.append((proc.pid, name))
    return proc


def handshakes(uri, client_dir, n):
    """Seconds from connect to the first reply (a 4 KiB read), n times, each
    a new connection: libnbd's handshake, TLS included, then one request."""
    script = f"""
import nbd, sys, time, json
out = []
for _ in range({n}):
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)
    t = time.perf_counter()
    h.connect_uri({uri!r} + ({client_dir!r} and ('?tls-certificates=' + {client_dir!r}) or ''))
    h.pread(4096, 0)
    out.append(time.perf_counter() - t)
    h.shutdown()
    del h
print(json.dumps(out))
"""
    p = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True,
                       timeout=300)
    if p.returncode:
        return {"error": p.stderr.strip()[-400:]}
    ms = sorted(v * 1000 for v in json.loads(p.stdout))
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 3),
            "p90_ms": round(ms[int(len(ms) * 0.9) - 1], 3), "max_ms": round(ms[-1], 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ramd", required=True, help="the ramd binary (target/release/ramd)")
    ap.add_argument("--certs", required=True, help="the servers' certificates directory")
    ap.add_argument("--client-dir", required=True, help="the client's certificates directory")
    ap.add_argument("--fio", required=True, help="fio, or a wrapper that runs it as nobody")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--ramp", type=int, default=1)
    ap.add_argument("--size", default="1g")
    ap.add_argument("--disk", default="2G")
    ap.add_argument("--handshakes", type=int, default=50)
    ap.add_argument("--out")
    args = ap.parse_args()
    workloads = args.workloads.split(",")
    doc = {"meta": {"harness": "bench/tls.py", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "runtime_s": args.runtime, "ramp_s": args.ramp, "size": args.size,
                    "nproc": os.cpu_count(), "kernel": os.uname().release,
                    "nbdkit": peers.version(["nbdkit", "--version"]),
                    "qemu-nbd": peers.version(["qemu-nbd", "--version"])},
           "targets": {}}
    try:
        for name in args.servers.split(","):
            tmp = tempfile.mkdtemp(prefix="ramd-tls-")
            os.chmod(tmp, 0o777)  # fio may run as nobody and writes its JSON here
            shm = tempfile.mkdtemp(prefix="ramd-tls-", dir="/dev/shm")
            peers.CLEAN.dirs += [tmp, shm]
            port = free_port()
            argv, why = server_argv(name, args, port, tmp, shm)
            if argv is None:
                doc["targets"][name] = {"skipped": why}
                continue
            tls = name.endswith("-tls")
            uri = f"{'nbds' if tls else 'nbd'}://127.0.0.1:{port}/{EXPORT}"
            t = doc["targets"][name] = {"cmd": shlex.join(argv), "uri": uri, "workloads": {}}
            peers.say(f"== {name}")
            proc = start(name, argv, os.path.join(tmp, "server.log"))
            deadline = time.monotonic() + 30
            while not greets(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start: "
                                       f"{peers.tail(os.path.join(tmp, 'server.log'))}")
                time.sleep(0.05)
            for wl in workloads:
                r = t["workloads"][wl] = peers.run_workload(wl, uri, proc.pid, args, tmp)
                peers.say(f"  {wl}: " + (f"ERROR {r['error']}" if "error" in r else
                                         f"{r['total_iops'] / 1000:.1f} kIOPS "
                                         f"{r['total_mib_s']:.0f} MiB/s, server "
                                         f"{r.get('server_cpu_us_per_io', '-')} us/IO"))
            t["handshake"] = handshakes(uri, args.client_dir if tls else "", args.handshakes)
            peers.say(f"  handshake: {t['handshake']}")
            peers.CLEAN.run()
    finally:
        peers.CLEAN.run()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(peers.table(doc["targets"], [w for w in workloads if w != "prefill"]))
    print("\nhandshake (connect to the first 4 KiB read's reply, new connection each):")
    for name, t in doc["targets"].items():
        h = t.get("handshake", {})
        print(f"  {name:<14} " + (h.get("error") or
                                  f"p50 {h.get('p50_ms')} ms  p90 {h.get('p90_ms')} ms  "
                                  f"max {h.get('max_ms')} ms  (n={h.get('n')})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
