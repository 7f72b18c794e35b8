#!/usr/bin/env python3
"""Medians across runs of bench/attach.sh's results, one column per path.

usage: attach_summary.py OUTDIR COLUMN...   (prints a markdown table)
"""
import glob
import json
import statistics
import sys


def fio_figures(path):
    job = json.load(open(path))["jobs"][0]
    iops = job["read"]["iops"] + job["write"]["iops"]
    bw = (job["read"]["bw_bytes"] + job["write"]["bw_bytes"]) / 2**20
    side = job["read"] if job["read"]["io_bytes"] else job["write"]
    pct = side["clat_ns"].get("percentile", {})
    ios = job["read"]["total_ios"] + job["write"]["total_ios"]
    mean_us = (
        job["read"]["lat_ns"]["mean"] * job["read"]["total_ios"]
        + job["write"]["lat_ns"]["mean"] * job["write"]["total_ios"]
    ) / max(ios, 1) / 1000
    return {
        "iops": iops,
        "mib_s": bw,
        "mean_us": mean_us,
        "p50_us": pct.get("50.000000", 0) / 1000,
        "p99_us": pct.get("99.000000", 0) / 1000,
        "p99.9_us": pct.get("99.900000", 0) / 1000,
        "max_us": side["clat_ns"]["max"] / 1000,
    }


ROWS = [
    ("randrw4k_qd64x2", "iops", "4 KiB randrw QD64x2 IOPS", "{:,.0f}"),
    ("randrw4k_qd64x2", "mean_us", "  mean latency us", "{:.0f}"),
    ("read4k_qd1", "p50_us", "4 KiB read QD1 p50 us", "{:.1f}"),
    ("read4k_qd1", "p99_us", "  p99 us", "{:.1f}"),
    ("read4k_qd1", "p99.9_us", "  p99.9 us", "{:.1f}"),
    ("read4k_qd1", "max_us", "  max us", "{:.0f}"),
    ("write4k_qd1", "p50_us", "4 KiB write QD1 p50 us", "{:.1f}"),
    ("write4k_qd1", "p99_us", "  p99 us", "{:.1f}"),
    ("write4k_qd1", "p99.9_us", "  p99.9 us", "{:.1f}"),
    ("write4k_qd1", "max_us", "  max us", "{:.0f}"),
    ("read1m_qd8", "mib_s", "1 MiB seq read QD8 MiB/s", "{:,.0f}"),
    ("write1m_qd8", "mib_s", "1 MiB seq write QD8 MiB/s", "{:,.0f}"),
    ("files", "untar_sync_s", "ext4: untar x20 + sync s", "{:.2f}"),
    ("files", "find_cold_s", "ext4: find, cold cache s", "{:.2f}"),
    ("files", "read_all_s", "ext4: read every file s", "{:.2f}"),
]


def median(out, col, name, key):
    vals = []
    for path in sorted(glob.glob(f"{out}/{col}.{name}.run*.json")):
        if name == "files":
            vals.append(json.load(open(path))[key])
        else:
            vals.append(fio_figures(path)[key])
    return statistics.median(vals) if vals else None


def main():
    out, cols = sys.argv[1], sys.argv[2:]
    print("| figure (median of runs) | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, key, label, fmt in ROWS:
        cells = []
        for col in cols:
            v = median(out, col, name, key)
            cells.append("-" if v is None else fmt.format(v))
        print(f"| {label} | " + " | ".join(cells) + " |")


main()
