#!/usr/bin/python3
"""ramd beside other NBD servers, one run: every server started here on a unix
socket, the same fio workloads against each, one JSON file and a table.

    /usr/bin/python3 bench/peers.py --ramd target/release/ramd --out run1.json
    /usr/bin/python3 bench/peers.py --ramd BIN --servers ramd,nbdkit-null \\
        --workloads randread_4k_qd1 --runtime 3 --ramp 1
    /usr/bin/python3 bench/peers.py --ramd new=BIN1 --ramd old=BIN2 --servers new,old,new,old
        (an A/B of two ramd builds in one run, each twice, alternating)

bench/peers.sh runs this RUNS times and bench/summarize.py takes the medians.

Servers (each skipped, with a note in the JSON, if its program is missing):
  nbdkit-memory-sparse  nbdkit memory DISK allocator=sparse
  nbdkit-memory-malloc  nbdkit memory DISK allocator=malloc
  nbdkit-memory-zstd    nbdkit memory DISK allocator=zstd (if this nbdkit has it)
  nbdkit-null           nbdkit null DISK: the transport's ceiling (no data kept)
  qemu-nbd              qemu-nbd over a sparse raw file on /dev/shm
  nbd-server            nbd-server over a sparse file on /dev/shm
  ramd                  ramd serve --drive ram0=DISK (--ramd BIN; --ramd NAME=BIN
                        names the server NAME, and may be given several times)

For each workload the record holds, per direction (read / write), IOPS, MiB/s
and completion latency (fio's clat) mean, p50, p99, p99.9 and max in
microseconds, and for the workload the server's CPU time per I/O: the CPU time
(user + system, all threads, children included) of the server's process tree,
read from /proc/PID/stat every 0.2 s, interpolated to the window fio measured
(after the ramp), divided by the I/Os fio counted in that window. fio runs on
the same CPUs as the server, so on a small machine that figure separates
servers better than IOPS.

Stdlib only; run with /usr/bin/python3. Needs fio with the nbd engine (libnbd)
and the servers above (scripts/test-deps.sh installs them).
"""
import argparse
import ctypes
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

# name: (fio rw, block size, iodepth per job, jobs; each job has its own
# connection, timed: runs --runtime after --ramp; else writes --size once)
WORKLOADS = {
    "prefill": ("write", "1M", 8, 1, False),
    "randread_4k_qd1": ("randread", "4k", 1, 1, True),
    "randwrite_4k_qd1": ("randwrite", "4k", 1, 1, True),
    "randrw_4k_qd64x2": ("randrw", "4k", 64, 2, True),
    "randrw_4k_qd128x1": ("randrw", "4k", 128, 1, True),
    "seqread_1m_qd8": ("read", "1M", 8, 1, True),
    "seqwrite_1m_qd8": ("write", "1M", 8, 1, True),
}
SERVERS = ["nbdkit-memory-sparse", "nbdkit-memory-malloc", "nbdkit-memory-zstd",
           "nbdkit-null", "qemu-nbd", "nbd-server", "ramd"]
EXPORT = "ram0"
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.2     # CPU sampling period
RESCAN_S = 1.0     # how often the server's process tree is looked up again


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def parse_size(s):
    """'2G', '2GiB', '512m' or a byte count -> bytes."""
    t = s.strip().lower().removesuffix("b").removesuffix("i")
    units = "kmgt"
    if t and t[-1] in units:
        return int(float(t[:-1]) * 1024 ** (units.index(t[-1]) + 1))
    return int(t)


# ------------------------------------------------------------------ cleanup
class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


try:  # looked up now: after fork, in preexec_fn, only the call itself runs
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def die_with_parent():
    """preexec_fn: SIGKILL this child if the harness dies (even by kill -9)."""
    if _PRCTL:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Cleanup:
    """Everything to undo: running processes (by pid) and temp directories."""

    def __init__(self):
        self.groups, self.dirs, self.fio = [], [], None

    def stop_group(self, pgid, name):
        """TERM the process group, wait up to 5 s, then KILL what is left."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                reap()
                if not group_alive(pgid):
                    return
                time.sleep(0.05)
        say(f"  warning: {name} (process group {pgid}) did not stop")

    def run(self):
        if self.fio and self.fio.poll() is None:
            # fio's jobs run in sessions of their own: fio must stop them itself
            self.fio.terminate()
            try:
                self.fio.wait(10)
            except subprocess.TimeoutExpired:
                self.fio.kill()
                self.fio.wait()
        self.fio = None
        for pgid, name in reversed(self.groups):
            self.stop_group(pgid, name)
        self.groups.clear()
        for d in reversed(self.dirs):
            shutil.rmtree(d, ignore_errors=True)
        self.dirs.clear()


CLEAN = Cleanup()


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def group_alive(pgid):
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st and st[4] == pgid and st[2] != "Z":
                return True
    return False


# ------------------------------------------------------------------ /proc
def proc_stat(pid):
    """/proc/PID/stat as a list: index i holds field i+1 of proc(5) (0 pid,
    1 comm, 2 state, 3 ppid, 4 process group, 13-16 utime stime cutime cstime);
    None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    head, rest = s.split(" (", 1)
    comm, tail = rest.rsplit(") ", 1)
    fields = tail.split()
    return [int(head), comm, fields[0], int(fields[1]), int(fields[2])] + fields[3:]


def tree(root):
    """root and all its descendants, from one pass over /proc."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st:
                kids.setdefault(st[3], []).append(st[0])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_seconds(pids):
    """utime + stime + cutime + cstime of these processes (all their threads;
    cutime/cstime hold children that already exited and were reaped)."""
    total = 0
    for p in pids:
        st = proc_stat(p)
        if st:
            total += sum(int(x) for x in st[13:17])
    return total / TICK


class CpuSampler(threading.Thread):
    """Samples (wall clock, tree CPU seconds) until stopped."""

    def __init__(self, root):
        super().__init__(daemon=True)
        self.root, self.samples, self.halt = root, [], threading.Event()

    def sample(self, pids):
        self.samples.append((time.time(), cpu_seconds(pids)))

    def run(self):
        pids, scanned = tree(self.root), time.monotonic()
        self.sample(pids)
        while not self.halt.wait(SAMPLE_S):
            if time.monotonic() - scanned >= RESCAN_S:
                pids, scanned = tree(self.root), time.monotonic()
            self.sample(pids)

    def finish(self):
        self.halt.set()
        self.join()
        self.sample(tree(self.root))

    def at(self, t):
        """Tree CPU seconds at wall time t, interpolated between samples."""
        s = self.samples
        if t <= s[0][0]:
            return s[0][1]
        for (t0, c0), (t1, c1) in zip(s, s[1:]):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
        return s[-1][1]


# ------------------------------------------------------------------ servers
class Server:
    def __init__(self, name, argv, sock, uri, pidfile=None, setup=None):
        self.name, self.argv, self.sock, self.uri = name, argv, sock, uri
        self.pidfile, self.setup = pidfile, setup
        self.pid = None

    def start(self, logpath):
        if self.setup:
            self.setup()
        say(f"  start: {shlex.join(self.argv)}")
        with open(logpath, "w") as log:
            proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True,
                                    preexec_fn=None if self.pidfile else die_with_parent)
        CLEAN.groups.append((proc.pid, self.name))
        deadline = time.monotonic() + 30
        if self.pidfile:  # daemonizes: the started process exits, the pid file names the server
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            while not os.path.exists(self.pidfile) and time.monotonic() < deadline:
                time.sleep(0.05)
            try:
                with open(self.pidfile) as f:
                    self.pid = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                raise RuntimeError(f"{self.name}: no pid file; log: {tail(logpath)}") from None
            CLEAN.groups.append((os.getpgid(self.pid), self.name))
        else:
            self.pid = proc.pid
        while time.monotonic() < deadline:
            if proc_stat(self.pid) is None or (not self.pidfile and proc.poll() is not None):
                raise RuntimeError(f"{self.name} exited; log: {tail(logpath)}")
            if nbd_greets(self.sock):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} never listened on {self.sock}; log: {tail(logpath)}")


def nbd_greets(path):
    """True once the server at path sends the newstyle greeting; the probe
    then ends the handshake politely (NBD_OPT_ABORT), so servers log no error."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(path)
            greeting = b""
            while len(greeting) < 18:
                chunk = s.recv(18 - len(greeting))
                if not chunk:
                    return False
                greeting += chunk
            if greeting[:16] != b"NBDMAGICIHAVEOPT":
                return False
            flags = struct.unpack(">H", greeting[16:])[0] & 3  # FIXED_NEWSTYLE, NO_ZEROES
            s.sendall(struct.pack(">I", flags) + b"IHAVEOPT" + struct.pack(">II", 2, 0))
            try:
                s.recv(20)  # the server's ack of the abort
            except OSError:
                pass
            return True
    except OSError:
        return False


def tail(path, n=600):
    try:
        with open(path) as f:
            return f.read()[-n:].strip()
    except OSError:
        return ""


def sparse_file(path, size):
    def make():
        with open(path, "wb") as f:
            f.truncate(size)
    return make


def nbdkit_allocators():
    try:
        out = subprocess.run(["nbdkit", "memory", "--dump-plugin"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {"sparse", "malloc"} | ({"zstd"} if "zstd=yes" in out else set())


def make_server(name, tmp, shm, disk, ramds):
    """The Server for name, or a string saying why it cannot run here."""
    sock = os.path.join(tmp, f"{name}.sock")
    uri = f"nbd+unix:///{EXPORT}?socket={sock}"
    if name.startswith("nbdkit"):
        if not shutil.which("nbdkit"):
            return "nbdkit not installed"
        if name == "nbdkit-null":
            plugin = ["null", str(disk)]
        else:
            alloc = name.rsplit("-", 1)[1]
            if alloc not in nbdkit_allocators():
                return f"this nbdkit's memory plugin has no allocator={alloc}"
            plugin = ["memory", str(disk), f"allocator={alloc}"]
        # nbdkit serves any export name the same
        return Server(name, ["nbdkit", "-f", "--exit-with-parent", "-U", sock, *plugin], sock, uri)
    if name == "qemu-nbd":
        if not shutil.which("qemu-nbd"):
            return "qemu-nbd not installed"
        img = os.path.join(shm, "qemu-nbd.img")
        # -t: keep serving after the first client; -e 16: up to 16 connections;
        # tmpfs has no O_DIRECT, so the page cache (writeback) it is.
        return Server(name, ["qemu-nbd", "-f", "raw", "-k", sock, "-x", EXPORT, "-t", "-e", "16",
                             "--cache=writeback", "--aio=threads", "--discard=unmap", img],
                      sock, uri, setup=sparse_file(img, disk))
    if name == "nbd-server":
        if not shutil.which("nbd-server"):
            return "nbd-server not installed"
        img = os.path.join(shm, "nbd-server.img")
        conf, pidfile = os.path.join(tmp, "nbd-server.conf"), os.path.join(tmp, "nbd-server.pid")

        def setup():
            sparse_file(img, disk)()
            with open(conf, "w") as f:
                f.write(f"[generic]\nunixsock = {sock}\n\n"
                        f"[{EXPORT}]\nexportname = {img}\ntrim = true\nflush = true\nfua = true\n")
        # Without -d it forks a child per connection (with -d it serves just
        # one): so it runs as a daemon and is found through its pid file.
        return Server(name, ["nbd-server", "-C", conf, "-p", pidfile], sock, uri,
                      pidfile=pidfile, setup=setup)
    if name in ramds:
        # A name ending in -supervised runs under `--supervise` (drive
        # memory in a memfd its supervisor keeps: docs/restart.md).
        supervise = ["--supervise"] if name.endswith("-supervised") else []
        return Server(name, [ramds[name], "serve", "--no-config", "--socket", sock,
                             "--api-socket", sock + ".api", "--drive", f"{EXPORT}={disk}",
                             "--log", "warn"] + supervise, sock, uri)
    if name == "ramd":
        return "no --ramd binary given"
    return f"unknown server {name}"


def nbdinfo(uri):
    """The export's flags as the server announces them (None without nbdinfo)."""
    if not shutil.which("nbdinfo"):
        return None
    try:
        out = subprocess.run(["nbdinfo", "--json", uri], capture_output=True, text=True,
                             timeout=20).stdout
        doc = json.loads(out)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    exp = (doc.get("exports") or [{}])[0]
    keep = {k: v for k, v in exp.items() if k.startswith(("can_", "block_size"))
            or k in ("export-size", "contexts")}
    keep["protocol"], keep["structured"] = doc.get("protocol"), doc.get("structured")
    return keep


# ------------------------------------------------------------------ fio
def direction(d, nonzero):
    """One direction of a fio job, in the units of the table (us, MiB/s)."""
    if not d or not d.get("total_ios") and not d.get("io_bytes"):
        return None if not nonzero else {}
    clat = d.get("clat_ns", {})
    pct = clat.get("percentile", {})

    def us(v):
        return None if v is None else round(v / 1000, 2)
    return {
        "iops": round(d["iops"], 1),
        "mib_s": round(d["bw_bytes"] / 2**20, 1),
        "ios": d["total_ios"],
        "clat_mean_us": us(clat.get("mean")),
        "clat_p50_us": us(pct.get("50.000000")),
        "clat_p99_us": us(pct.get("99.000000")),
        "clat_p99_9_us": us(pct.get("99.900000")),
        "clat_max_us": us(clat.get("max")),
        "lat_mean_us": us(d.get("lat_ns", {}).get("mean")),
    }


def run_workload(wl, uri, server_pid, args, tmp):
    rw, bs, depth, jobs, timed = WORKLOADS[wl]
    out = os.path.join(tmp, f"fio-{wl}.json")
    argv = [args.fio, f"--name={wl}", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
            f"--bs={bs}", f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
            f"--size={args.size}", "--norandommap", "--randrepeat=0",
            "--percentile_list=50:99:99.9", "--output-format=json", f"--output={out}"]
    if timed:
        argv += ["--time_based", f"--runtime={args.runtime}", f"--ramp_time={args.ramp}"]
    rec = {"rw": rw, "bs": bs, "iodepth": depth, "numjobs": jobs, "connections": jobs}
    cpu0 = cpu_seconds(tree(server_pid))
    t0 = time.time()
    # fio first, then the sampler thread: no other thread runs while Popen forks
    CLEAN.fio = proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True,
                                        preexec_fn=die_with_parent)
    sampler = CpuSampler(server_pid)
    sampler.start()
    _, err = proc.communicate()
    wall = time.time() - t0
    CLEAN.fio = None
    time.sleep(0.2)  # forking servers: let the per-connection children exit and be reaped
    sampler.finish()
    rec["wall_s"] = round(wall, 2)
    try:
        with open(out) as f:
            text = f.read()
        doc = json.loads(text[text.index("{"):])  # fio may print notes before the JSON
        job = doc["jobs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        rec["error"] = f"fio exit {proc.returncode}: {err.strip()[-500:]}"
        return rec
    if job.get("error") or proc.returncode:
        rec["error"] = f"fio exit {proc.returncode}, job error {job.get('error')}: {err.strip()[-500:]}"
    ios, runtime_ms = 0, 0
    for ddir in ("read", "write"):
        d = direction(job.get(ddir), False)
        if d:
            rec[ddir] = d
            ios += d["ios"]
            runtime_ms = max(runtime_ms, job[ddir]["runtime"])
    rec["total_iops"] = round(sum(rec[d]["iops"] for d in ("read", "write") if d in rec), 1)
    rec["total_mib_s"] = round(sum(rec[d]["mib_s"] for d in ("read", "write") if d in rec), 1)
    # fio's own figure is per job under group_reporting: times the jobs, in % of one CPU
    rec["client_cpu_pct"] = round((job.get("usr_cpu", 0) + job.get("sys_cpu", 0)) * jobs, 1)
    # The window fio measured: it ends when fio wrote its report, and lasted
    # the direction's runtime (the ramp before it is not counted).
    end = doc.get("timestamp_ms", t0 * 1000 + wall * 1000) / 1000
    start = max(end - runtime_ms / 1000, t0)
    if ios and end > start:
        cpu = sampler.at(end) - sampler.at(start)
        rec["server_cpu_s"] = round(cpu, 3)
        rec["server_cpu_pct"] = round(100 * cpu / (end - start), 1)
        rec["server_cpu_us_per_io"] = round(cpu / ios * 1e6, 3)
    if rec["total_iops"]:
        # The earlier harness's figure, kept to compare with runs made by it:
        # CPU over fio's whole run (start-up, ramp) / wall time / measured IOPS.
        whole = sampler.samples[-1][1] - cpu0
        rec["server_cpu_pct_whole_run"] = round(100 * whole / wall, 1)
        rec["server_cpu_us_per_io_whole_run"] = round(whole / wall / rec["total_iops"] * 1e6, 3)
    return rec


# ------------------------------------------------------------------ table
def table(targets, workloads):
    head = (f"{'server':<21} {'workload':<18} {'dir':<5} {'kIOPS':>7} {'MiB/s':>7} "
            f"{'mean':>7} {'p50':>7} {'p99':>7} {'p99.9':>8} {'max':>8} {'srv us/IO':>9} {'srv%':>5}")
    lines = [head, "-" * len(head)]

    def f(v, spec):
        return "-" if v is None else format(v, spec)
    for name, t in targets.items():
        if "workloads" not in t:
            lines.append(f"{name:<21} {t.get('skipped') or t.get('error')}")
            continue
        for wl in workloads:
            r = t["workloads"].get(wl, {})
            if "error" in r and "read" not in r and "write" not in r:
                lines.append(f"{name:<21} {wl:<18} error: {r['error'][:80]}")
                continue
            first = True
            for ddir in ("read", "write"):
                d = r.get(ddir)
                if not d:
                    continue
                srv = (f"{f(r.get('server_cpu_us_per_io'), '9.2f')} {f(r.get('server_cpu_pct'), '5.0f')}"
                       if first else "")
                lines.append(
                    f"{name:<21} {wl:<18} {ddir:<5} {d['iops'] / 1000:>7.1f} {d['mib_s']:>7.0f} "
                    f"{f(d['clat_mean_us'], '7.1f')} {f(d['clat_p50_us'], '7.1f')} "
                    f"{f(d['clat_p99_us'], '7.1f')} {f(d['clat_p99_9_us'], '8.1f')} "
                    f"{f(d['clat_max_us'], '8.0f')} {srv}".rstrip())
                first = False
    lines.append("latency: fio completion latency (clat) in us; srv us/IO: the server's CPU "
                 "time per I/O over the measured window; srv%: its CPU in % of one CPU")
    return "\n".join(lines)


# ------------------------------------------------------------------ main
def version(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def main():
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--ramd", action="append", default=[],
                    help="[NAME=]BIN: a ramd binary, served as NAME (default ramd); "
                    "repeatable (env RAMD: one binary)")
    ap.add_argument("--out", help="write the JSON here (default: only the table)")
    ap.add_argument("--servers",
                    help="comma list, run in this order; a name may repeat (default: all, "
                    "one ramd server per --ramd)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="comma list, run in this order (default: all)")
    ap.add_argument("--runtime", type=int, default=int(env("RUNTIME", "8")),
                    help="seconds measured per timed workload (env RUNTIME, default 8)")
    ap.add_argument("--ramp", type=int, default=int(env("RAMP", "2")),
                    help="seconds run before measuring (env RAMP, default 2)")
    ap.add_argument("--size", default=env("SIZE", "1g"),
                    help="the region fio uses, and what prefill writes (default 1g)")
    ap.add_argument("--disk", default=env("DISK", "2G"), help="each server's disk (default 2G)")
    ap.add_argument("--fio", default=env("FIO", "fio"))
    args = ap.parse_args()
    ramds = {}
    for spec in args.ramd or ([env("RAMD")] if env("RAMD") else []):
        name, _, path = spec.rpartition("=")
        ramds[name or "ramd"] = os.path.abspath(path)
    default = [s for s in SERVERS if s != "ramd"] + (list(ramds) or ["ramd"])
    servers = [s for s in (args.servers or ",".join(default)).split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w}; known: {', '.join(WORKLOADS)}")
    disk = parse_size(args.disk)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    doc = {"meta": {
        "harness": "bench/peers.py",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runtime_s": args.runtime, "ramp_s": args.ramp, "size": args.size, "disk": disk,
        "nproc": os.cpu_count(), "kernel": os.uname().release, "loadavg_start": load0,
        "fio": version([args.fio, "--version"]), "nbdkit": version(["nbdkit", "--version"]),
        "qemu-nbd": version(["qemu-nbd", "--version"]),
        "ramd": ramds,
        "workloads": {w: dict(zip(("rw", "bs", "iodepth", "numjobs", "timed"), WORKLOADS[w]))
                      for w in workloads},
        "cpu_per_io": "server process tree CPU (utime+stime+cutime+cstime from /proc/PID/stat, "
                      f"sampled every {SAMPLE_S} s) over fio's measured window / I/Os in it",
    }, "targets": {}}

    def save():
        if args.out:
            with open(args.out + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(args.out + ".tmp", args.out)

    try:
        for name in servers:
            tmp = tempfile.mkdtemp(prefix="ramd-peers-")
            CLEAN.dirs.append(tmp)
            shm = tempfile.mkdtemp(prefix="ramd-peers-", dir="/dev/shm")
            CLEAN.dirs.append(shm)
            srv = make_server(name, tmp, shm, disk, ramds)
            if isinstance(srv, str):
                say(f"== {name}: skipped ({srv})")
                doc["targets"].setdefault(name, {"skipped": srv})
                CLEAN.run()
                continue
            say(f"== {name}")
            key, n = name, 2
            while key in doc["targets"]:  # the same server again: name#2, name#3...
                key, n = f"{name}#{n}", n + 1
            t = doc["targets"][key] = {"kind": "nbd", "cmd": shlex.join(srv.argv), "uri": srv.uri}
            try:
                srv.start(os.path.join(tmp, "server.log"))
                t["nbdinfo"] = nbdinfo(srv.uri)
                t["workloads"] = {}
                for wl in workloads:
                    r = t["workloads"][wl] = run_workload(wl, srv.uri, srv.pid, args, tmp)
                    if "error" in r:
                        say(f"  {wl}: ERROR {r['error']}")
                    else:
                        say(f"  {wl}: {r['total_iops'] / 1000:.1f} kIOPS {r['total_mib_s']:.0f} MiB/s"
                            f", server {r.get('server_cpu_us_per_io', '-')} us/IO")
                log = tail(os.path.join(tmp, "server.log"), 2000)
                if log:
                    t["server_log"] = log
            except RuntimeError as e:
                t["error"] = str(e)
                say(f"  ERROR {e}")
            finally:
                CLEAN.run()  # stop it, remove its socket directory and its /dev/shm files
            save()
        with open("/proc/loadavg") as f:
            doc["meta"]["loadavg_end"] = f.read().split()[:3]
        save()
        print(table(doc["targets"], workloads))
        if args.out:
            print(f"JSON: {args.out}")
    except Interrupted as e:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        say(f"interrupted ({e}): stopping servers, removing temp files")
        CLEAN.run()
        doc["meta"]["interrupted"] = str(e)
        save()
        return 130
    finally:
        CLEAN.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
