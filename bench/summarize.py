#!/usr/bin/env python3
"""Median of each nbdbench figure across several `nbdbench peers` JSON files,
printed as a Markdown table (one row per server)."""
import json
import statistics
import sys

COLS = [
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


def targets(doc):
    t = doc.get("targets") or doc.get("peers") or doc
    return {k: v for k, v in t.items() if isinstance(v, dict) and "workloads" in v}


def value(t, wl, ddir, key):
    w = t.get("workloads", {}).get(wl)
    if not w or "error" in w:
        return None
    src = w.get(ddir) if ddir else w
    return (src or {}).get(key)


def main(paths):
    docs = [json.load(open(p)) for p in paths]
    names = []
    for d in docs:
        for n in targets(d):
            if n not in names:
                names.append(n)
    print(f"Median of {len(docs)} run(s): " + ", ".join(paths))
    print()
    print("| server | " + " | ".join(c[3] for c in COLS) + " |")
    print("|---" * (len(COLS) + 1) + "|")
    for n in names:
        cells = []
        for wl, ddir, key, _, scale in COLS:
            vals = [value(targets(d)[n], wl, ddir, key) for d in docs if n in targets(d)]
            vals = [v for v in vals if v is not None]
            cells.append(f"{statistics.median(vals) * scale:.1f}" if vals else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
