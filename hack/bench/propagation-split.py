#!/usr/bin/env python3
"""Where the time of each create went in a `make bench-propagation` run: medians and p90 of
the controller's pass (woken -> snapshots published, and the compile within it) and of the
shared proxy's decode and table build, over the create phase.

Run the bench with its trace and the controller's debug log, keeping its stderr:

  COXSWAIN_BENCH_TRACE=1 COXSWAIN_BENCH_CONTROLLER_LOG=coxswain_operator=debug \
    make bench-propagation ROUTES=3000 2> bench.err
  hack/bench/propagation-split.py bench.err

It reads the log directory the bench names on stderr ("controller and proxy logs in DIR") and
the `snapshots published since_woken_us compile_us compiler_us store_us` and `snapshot applied decode_us build_us`
lines logged between the first and the last create; and, matching timestamps across both
logs and the bench's own, how long a create took to wake the controller and a snapshot to
cross the stream.
"""
import datetime
import re
import statistics
import sys


def main(bench_err):
    text = open(bench_err).read()
    logs = re.search(r"controller and proxy logs in (\S+)", text)
    sent = re.findall(r"^create n\d+: sent at (\S+) (\S+)", text, re.M)
    if not logs or not sent:
        sys.exit(f"{bench_err}: no log directory or no traced creates (COXSWAIN_BENCH_TRACE=1?)")
    # "2026-12-05 21:31:17.993475675" -> "2026-12-05T21:31:17.993475", as the logs write time
    # (the bench writes the hour without a leading zero: "1:21:50" is 01:21:50).
    stamp = lambda d, t: f"{d}T{t.zfill(len(t) + 1) if t.index(':') == 1 else t}"[:26]
    first, last = stamp(*sent[0]), stamp(*sent[-1])
    rows = [
        ("controller.err", "snapshots published", "since_woken_us", "controller, woken -> published"),
        ("controller.err", "snapshots published", "compile_us", "controller, compile and publish"),
        ("controller.err", "snapshots published", "compiler_us", "controller, the compiler alone"),
        ("controller.err", "snapshots published", "store_us", "controller, copying its caches for the pass"),
        ("proxy.err", "snapshot applied", "decode_us", "proxy, decode"),
        ("proxy.err", "snapshot applied", "build_us", "proxy, table build"),
    ]
    def report(label, values):
        values = sorted(values)
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        print(f"{label}: median {statistics.median(values):.2f} ms, p90 {p90:.2f} ms (n={len(values)})")

    for file, message, field, label in rows:
        values = []
        for line in open(f"{logs.group(1)}/{file}"):
            if message not in line or not first <= line[:26] <= last + "9":
                continue
            m = re.search(field + r"=(\d+)", line)
            if m:
                values.append(int(m.group(1)) / 1000)
        if not values:
            print(f"{label}: no {field} lines in the create phase")
            continue
        report(label, values)

    # Across the two processes (one clock): a create's POST -> the controller waking for it
    # (the API server and the watch), and a snapshot's queueing -> the proxy applying it, less
    # its decode and build (the stream carrying it).
    when = lambda line: datetime.datetime.fromisoformat(line[:26])
    sent_at = [datetime.datetime.fromisoformat(stamp(*s)) for s in sent]
    woken, queued, carried = [], {}, []
    for line in open(f"{logs.group(1)}/controller.err"):
        if not first <= line[:26] <= last + "9":
            continue
        m = re.search(r"since_woken_us=(\d+)", line)
        if "snapshots published" in line and m:
            woken.append(when(line) - datetime.timedelta(microseconds=int(m.group(1))))
        m = re.search(r'snapshot queued.*version=(\w+)', line)
        if m:
            queued.setdefault(m.group(1), when(line))
    for line in open(f"{logs.group(1)}/proxy.err"):
        m = re.search(r"snapshot applied version=(\w+) decode_us=(\d+) build_us=(\d+)", line)
        if m and m.group(1) in queued:
            spent = (when(line) - queued[m.group(1)]).total_seconds() * 1000
            carried.append(spent - (int(m.group(2)) + int(m.group(3))) / 1000)
    waits = []
    for t in sent_at:
        after = [w for w in woken if w >= t]
        if after:
            waits.append((min(after) - t).total_seconds() * 1000)
    if waits:
        report("create sent -> controller woken (API server and watch)", waits)
    if carried:
        report("snapshot queued -> applied, less decode and build (the stream)", carried)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
