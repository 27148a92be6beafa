#!/usr/bin/env python3
"""Per-kernel GPU time from `ncu --csv --metrics gpu__time_duration.sum ...` on stdin.

Prints one line per kernel name (first 60 characters), most total time first:
`us/call  xcalls  total ms  name`, then a TOTAL line (every profiled kernel's time summed, and the
number of kernels). ncu serialises kernels, so the total is the GPU-busy time of what it profiled:
compare it with the CUDA-event time of the same run to see the gaps between kernels. Run ncu with
`--clock-control none --cache-control none` for times at the clocks and caches of a normal run.

    ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum \\
        ./bench_train_benchmark --layers 2 --steps 1 --warmup 1 2>/dev/null | python3 ncu_table.py
"""
import collections
import csv
import sys


def main():
    times = collections.defaultdict(list)
    rows = [line for line in sys.stdin if line.startswith('"')]
    for r in csv.DictReader(rows):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        if unit in ("ns", "nsecond"):
            v /= 1000.0
        elif unit in ("ms", "msecond"):
            v *= 1000.0
        elif unit not in ("us", "usecond"):
            sys.exit(f"ncu_table: unknown unit {unit!r}")
        times[r["Kernel Name"][:60]].append(v)
    total_us = 0.0
    calls = 0
    for name, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(v) / len(v):9.1f} us x{len(v):5d} {sum(v) / 1000.0:9.2f} ms  {name}")
        total_us += sum(v)
        calls += len(v)
    print(f"TOTAL {total_us / 1000.0:.2f} ms over {calls} kernels")


if __name__ == "__main__":
    main()
