#!/usr/bin/python3
"""Medians across runs of bench/peers.py (one JSON file per run), printed as
Markdown: the throughput and CPU table, then the latency table (p50, p99,
p99.9 and max of fio's completion latency).

    bench/summarize.py bench/results/DIR/run*.json

Also reads the runs under bench/results/ made before bench/peers.py existed
(same layout; they have no max latency, shown as "-"). For the mixed
workloads a latency figure is the worse of the read and write figures of a
run; the median is taken over runs."""
import json
import statistics
import sys

# (workload, direction or None for the workload's own figures, key, header, scale)
MAIN = [
    ("randread_4k_qd1", "read", "iops", "rr QD1 kIOPS", 1e-3),
    ("randread_4k_qd1", "read", "clat_p50_us", "rr QD1 p50 us", 1),
    ("randread_4k_qd1", "read", "clat_p99_us", "rr QD1 p99 us", 1),
    ("randwrite_4k_qd1", "write", "iops", "rw QD1 kIOPS", 1e-3),
    ("randwrite_4k_qd1", "write", "clat_p50_us", "rw QD1 p50 us", 1),
    ("randwrite_4k_qd1", "write", "clat_p99_us", "rw QD1 p99 us", 1),
    ("randrw_4k_qd64x2", None, "total_iops", "mix QD64x2 kIOPS", 1e-3),
    ("randrw_4k_qd64x2", None, "server_cpu_us_per_io", "QD64x2 srv us/IO", 1),
    ("randrw_4k_qd128x1", None, "total_iops", "mix QD128x1 kIOPS", 1e-3),
    ("randrw_4k_qd128x1", None, "server_cpu_us_per_io", "QD128x1 srv us/IO", 1),
    ("seqread_1m_qd8", None, "total_mib_s", "seq read MiB/s", 1),
    ("seqwrite_1m_qd8", None, "total_mib_s", "seq write MiB/s", 1),
    ("prefill", None, "total_mib_s", "prefill MiB/s", 1),
]
# latency table: workload, direction ("worst" = the worse of read and write), label
LAT = [
    ("randread_4k_qd1", "read", "rr QD1"),
    ("randwrite_4k_qd1", "write", "rw QD1"),
    ("randrw_4k_qd64x2", "worst", "mix QD64x2"),
    ("randrw_4k_qd128x1", "worst", "mix QD128x1"),
]
PCTS = [("clat_p50_us", "p50"), ("clat_p99_us", "p99"), ("clat_p99_9_us", "p99.9"),
        ("clat_max_us", "max")]


def targets(doc):
    t = doc.get("targets") or doc.get("peers") or doc
    return {k: v for k, v in t.items() if isinstance(v, dict) and "workloads" in v}


def value(t, wl, ddir, key):
    w = t.get("workloads", {}).get(wl)
    if not w or "error" in w:
        return None
    if ddir == "worst":
        vals = [(w.get(d) or {}).get(key) for d in ("read", "write")]
        vals = [v for v in vals if v is not None]
        return max(vals) if vals else None
    src = w.get(ddir) if ddir else w
    return (src or {}).get(key)


def median(docs, name, wl, ddir, key):
    vals = [value(targets(d)[name], wl, ddir, key) for d in docs if name in targets(d)]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def main_cell(v, scale):
    return "-" if v is None else f"{v * scale:.1f}"


def cell(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 1000 else f"{v:.1f}"


def main(paths):
    if not paths:
        sys.exit(__doc__)
    docs = [json.load(open(p)) for p in paths]
    names = []
    for d in docs:
        for n in targets(d):
            if n not in names:
                names.append(n)
    print(f"Median of {len(docs)} run(s): " + ", ".join(paths))
    print()
    old = [p for p, d in zip(paths, docs) if d.get("meta", {}).get("harness") != "bench/peers.py"]
    print("srv us/IO: the server's CPU time per I/O over fio's measured window"
          + (f"; in {len(old)} run(s) made before bench/peers.py existed, over fio's whole"
             " run, start-up and ramp included (typically 0-15% lower)" if old else "") + ".")
    print()
    print("| server | " + " | ".join(c[3] for c in MAIN) + " |")
    print("|---" * (len(MAIN) + 1) + "|")
    for n in names:
        cells = [main_cell(median(docs, n, wl, ddir, key), scale) for wl, ddir, key, _, scale in MAIN]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print()
    print("Completion latency in us (mix: the worse of read and write in each run):")
    print()
    print("| server | " + " | ".join(f"{lab} {p}" for _, _, lab in LAT for _, p in PCTS) + " |")
    print("|---" * (len(LAT) * len(PCTS) + 1) + "|")
    for n in names:
        cells = [cell(median(docs, n, wl, ddir, key)) for wl, ddir, _ in LAT for key, _ in PCTS]
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
