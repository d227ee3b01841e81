"""The Python package against the Rust API on the same lines, in one run.

    python benches/python_api.py MODEL LINES_DIR [--runtime cpu|cuda] [--repeat K] [--runs N]
        [--top-k K]

Lines are the PNG images of LINES_DIR (benches/lines.py), repeated K times, written once
to an archive that both sides read. It prints:
- Rust API: the CLI's `bench --only-scheduled` on that archive, the scheduled run's median
  of N runs after its warm-ups (lines/s);
- Python: `Model.run` on the same arrays, median of N runs after as many warm-ups as the
  CLI's most (numpy outputs included), and its ratio to the Rust API's; then again with
  each run's outputs freed before the next starts, as the Rust API's loop does;
- outputs: Python's scheduled run against the CLI's `run`, and Python's one by one against
  the CLI's `run --one-by-one` (same plans on the same shapes: the same bits expected),
  as the largest difference and the count of samples equal bit for bit.
`--top-k K`: both sides' outputs reduced to their top K on the device (a few kilobytes
instead of hundreds of megabytes): what of the difference the outputs make.
Needs the wheel installed (scripts/python.sh) and the CLI (TRACT_RAGGED_BIN, else the
workspace's debug build).
"""

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import tract_ragged
from lines import lines as read_lines

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = os.environ.get("TRACT_RAGGED_BIN", str(ROOT / "target" / "debug" / "tract-ragged"))
RAGGED = ["--ragged", "x:3", "--input-fact", "N,3,48,W,f32"]


def read_outputs(path):
    """A `tract-ragged run` archive: each sample's outputs in order."""
    outs = {}
    with np.load(path) as z:
        for name in z.files:
            sample, output = name[1:].split("_o")
            outs.setdefault(int(sample), {})[int(output)] = z[name]
    return [[outs[i][j] for j in sorted(outs[i])] for i in sorted(outs)]


def compare(found, expected):
    """(largest |difference|, samples equal bit for bit) of two runs' outputs."""
    assert len(found) == len(expected), f"{len(found)} samples against {len(expected)}"
    worst, same = 0.0, 0
    for f, e in zip(found, expected):
        assert len(f) == len(e) and all(a.shape == b.shape for a, b in zip(f, e))
        worst = max([worst] + [float(np.abs(a.astype(np.float64) - b).max(initial=0)) for a, b in zip(f, e)])
        same += all(a.tobytes() == b.tobytes() for a, b in zip(f, e))
    return worst, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("lines")
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--top-k", type=int)
    args = ap.parse_args()
    top_k = ["--top-k", str(args.top_k)] if args.top_k else []
    lines = read_lines(args.lines, args.repeat)
    n = len(lines)
    with tempfile.TemporaryDirectory() as d:
        archive = pathlib.Path(d, "lines.npz")
        np.savez(archive, **{f"s{i:04}": x for i, x in enumerate(lines)})
        cli = [CLI, "bench", args.model, *RAGGED, "--runtime", args.runtime, "--samples",
               str(archive), "--only-scheduled", "--runs", str(args.runs), *top_k]
        printed = subprocess.run(cli, check=True, capture_output=True, text=True).stdout
        row = re.search(r"^ragged, scheduled \(run, (\d+) lanes\).*?\s([\d.]+)\s+\d+\s+[\d.]+$", printed, re.M)
        assert row, f"no scheduled row in the CLI's bench:\n{printed}"
        lanes, rust_ms = int(row.group(1)), float(row.group(2))

        model = tract_ragged.Model(args.model, "x:3", input_fact="N,3,48,W,f32", runtime=args.runtime,
                                    top_k=args.top_k)
        # The CLI warms up twice per lane on a device (each lane prepares its plans and
        # captures its graphs): as many here, whichever lanes took the batches.
        for _ in range(2 * lanes if args.runtime != "cpu" else 1):
            model.run(lines)
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            scheduled = model.run(lines)
            times.append(time.perf_counter() - t)
        python_ms = statistics.median(times) * 1e3
        # As the Rust API's loop runs: each run's outputs freed before the next starts (the
        # loop above holds the previous run's while the next one allocates its own).
        del scheduled
        freed = []
        for _ in range(args.runs):
            t = time.perf_counter()
            outputs = model.run(lines)
            del outputs
            freed.append(time.perf_counter() - t)
        freed_ms = statistics.median(freed) * 1e3
        scheduled = model.run(lines)

        def cli_run(*extra):
            out = pathlib.Path(d, "out.npz")
            subprocess.run([CLI, "run", args.model, *RAGGED, "--runtime", args.runtime, "--samples",
                            str(archive), "--out", str(out), *top_k, *extra], check=True, capture_output=True)
            return read_outputs(out)

        worst, same = compare(scheduled, cli_run())
        alone_worst, alone_same = compare(model.run_one_by_one(lines), cli_run("--one-by-one"))

    print(f"lines: {n} ({n // args.repeat} x {args.repeat}), runtime {model.runtime}, {lanes} lanes, "
          f"median of {args.runs} runs" + (f", top {args.top_k}" if args.top_k else ", whole outputs"))
    print(f"Rust API (tract-ragged bench, scheduled): {rust_ms:.1f} ms, {n / rust_ms * 1e3:.0f} lines/s")
    print(f"Python (Model.run, numpy outputs):        {python_ms:.1f} ms, {n / python_ms * 1e3:.0f} lines/s, "
          f"{python_ms / rust_ms:.2f}x the Rust API's time")
    print(f"Python, each run's outputs freed before the next: {freed_ms:.1f} ms, {n / freed_ms * 1e3:.0f} lines/s, "
          f"{freed_ms / rust_ms:.2f}x")
    print(f"scheduled, Python against the CLI's run: largest |difference| {worst:.2e}, "
          f"{same}/{n} samples equal bit for bit")
    print(f"one by one, Python against the CLI's --one-by-one: largest |difference| {alone_worst:.2e}, "
          f"{alone_same}/{n} samples equal bit for bit")


if __name__ == "__main__":
    sys.exit(main())
