#!/usr/bin/env python3
"""Where each scenario's Envoy CPU goes, from a system-wide `perf` profile of a `make bench` run.

`make bench` measures Envoy's CPU per request, whole. This splits it by the code that ran on the
Envoy worker threads (the threads that serve requests): V8's compiled wasm (the filter's own code:
perf has no symbols for it and labels it /tmp/perf-<pid>.map), Envoy's binary (its HTTP stack, the
proxy-wasm host and V8's runtime), the kernel, libc and the rest. Each share is multiplied by the
round's Envoy CPU/request, so the parts add up to the bench's figure; the medians over rounds are
printed. A share does not depend on how busy the machine is the way CPU per request does, so the
difference between two scenarios' wasm parts is the steadier measure of what a filter's own code
costs in Envoy.

    perf record -a -F 1999 -o target/bench/perf.data -- \\
        cargo run --release -p tollgate-tools --bin bench -- --only wasm-floor,wasm-floor-calls,tollgate-lease
    python3 bench/perf-split.py target/bench/perf.data target/bench/latest.json

Needs `perf` (linux-perf) and root or kernel.perf_event_paranoid <= 0. The JSON's rounds name their
Envoy processes (envoy_pids). Samples cover each process's whole life (warm-up and slices alike,
the same mix of requests), not only the measured slices.
"""

import collections
import json
import statistics
import subprocess
import sys

PARTS = ["wasm (JIT)", "envoy", "kernel", "libc", "other"]


def part_of(dso):
    if "/tmp/perf-" in dso:
        return "wasm (JIT)"
    if dso.endswith("/envoy"):
        return "envoy"
    if "kernel" in dso:
        return "kernel"
    if "libc.so" in dso:
        return "libc"
    return "other"


def worker_samples(perf_data):
    """{pid: Counter(part -> samples)} over Envoy worker threads."""
    out = subprocess.run(
        ["perf", "script", "-i", perf_data, "-F", "comm,pid,tid,ip,dso"],
        capture_output=True, text=True, check=True,
    ).stdout
    by_pid = collections.defaultdict(collections.Counter)
    for line in out.splitlines():
        # "wrk:worker_0 12078/12080  55f1c2a3b4c5 (/path/to/dso)"
        comm, _, rest = line.strip().partition(" ")
        if not comm.startswith("wrk:worker"):
            continue
        fields = rest.split()
        if not fields or "/" not in fields[0]:
            continue
        pid = int(fields[0].split("/")[0])
        dso = line.rsplit("(", 1)[-1].rstrip(")") if "(" in line else ""
        by_pid[pid][part_of(dso)] += 1
    return by_pid


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    samples = worker_samples(sys.argv[1])
    with open(sys.argv[2]) as f:
        bench = json.load(f)
    print("| scenario | Envoy CPU µs/req | " + " | ".join(PARTS) + " | worker samples |")
    print("|---|---:|" + "---:|" * len(PARTS) + "---:|")
    for scenario in bench["scenarios"]:
        per_part = collections.defaultdict(list)
        cpus, counted = [], 0
        for rnd in scenario["rounds"]:
            cpu = rnd.get("envoy_cpu_us_per_req")
            got = collections.Counter()
            for pid in rnd.get("envoy_pids", []):
                got.update(samples.get(pid, {}))
            total = sum(got.values())
            if not cpu or total == 0:
                continue
            cpus.append(cpu)
            counted += total
            for part in PARTS:
                per_part[part].append(cpu * got[part] / total)
        if not cpus:
            continue
        parts = " | ".join(f"{statistics.median(per_part[p]):.1f}" for p in PARTS)
        print(f"| {scenario['name']} | {statistics.median(cpus):.1f} | {parts} | {counted} |")


if __name__ == "__main__":
    main()
