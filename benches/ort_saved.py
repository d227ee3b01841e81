"""ONNX Runtime's CPU provider on saved samples: the reference rows of the speed issue,
beside the CLI's own (`tract-ragged bench ... --save-samples SAMPLES.npz`), without the
Python package (the GPU machine's host has onnxruntime but no wheel of ours is needed).

    python benches/ort_saved.py MODEL SAMPLES.npz [--threads T] [--runs N] [--padded B]
    python benches/ort_saved.py MODEL SAMPLES.npz --profile [--threads T] [--runs N]

SAMPLES.npz: one float32 array per sample, without the batch axis (text lines [3, 48, W],
pages [3, H, W]). One row, the median of N runs after a warm-up, T intra-op threads:
- one by one (the default): each sample alone, exact (the detectors' reference);
- `--padded B`: width-sorted batches of B zero-padded along the last axis to the widest of
  the batch, what RapidOCR and PaddleOCR do for text lines: inexact, the recognisers'
  reference (benches/ort_cpu.py's row, there beside the package's run in one process).
`--profile`: ONNX Runtime's own profiler over N runs one by one: the time of each op type
and the slowest nodes, each the median over the runs, to set beside `tract-ragged profile`.
"""

import argparse
import collections
import json
import time

import numpy as np
import onnxruntime as ort


def session(model, threads, profile=False):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = "/tmp/ort_saved_profile"
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def profile(args, samples):
    s = session(args.model, args.threads, profile=True)
    name = s.get_inputs()[0].name
    for _ in range(args.runs + 1):
        for x in samples:
            s.run(None, {name: x[None]})
    with open(s.end_profiling()) as f:
        events = json.load(f)
    times, op_of = collections.defaultdict(list), {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"][: -len("_kernel_time")]
            times[node].append(e["dur"])
            op_of[node] = e["args"].get("op_name", "?")
    # Each node runs once a sample a run; the first run over the samples is the warm-up.
    n = len(samples)
    node_ms = {
        node: float(np.median(np.array(d[n:]).reshape(-1, n).sum(1))) / 1e3
        for node, d in times.items()
        if len(d) >= 2 * n and len(d) % n == 0
    }
    total = sum(node_ms.values())
    print(f"ONNX Runtime {ort.__version__}, {args.threads} threads, {n} sample(s) one by one: "
          f"sum of nodes {total:.1f} ms a pass, medians of {args.runs} runs")
    by_op, count = collections.Counter(), collections.Counter()
    for node, ms in node_ms.items():
        by_op[op_of[node]] += ms
        count[op_of[node]] += 1
    for op, ms in by_op.most_common():
        print(f"{ms:9.3f}ms {100 * ms / total:5.1f}%  {op:<28} {count[op]} node(s)")
    print("slowest nodes:")
    for node, ms in sorted(node_ms.items(), key=lambda kv: -kv[1])[:30]:
        print(f"{ms:9.3f}ms  {op_of[node]:<20} {node}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("samples")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--padded", type=int, metavar="B", help="width-sorted padded batches of B")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    archive = np.load(args.samples)
    samples = [archive[k].astype(np.float32) for k in archive.files]
    if not samples:
        raise SystemExit(f"{args.samples}: no samples")
    if args.profile:
        return profile(args, samples)
    s = session(args.model, args.threads)
    name = s.get_inputs()[0].name
    if args.padded:
        order = sorted(range(len(samples)), key=lambda i: samples[i].shape[-1])
        batches = []
        for at in range(0, len(order), args.padded):
            batch = order[at:at + args.padded]
            width = max(samples[i].shape[-1] for i in batch)
            packed = np.zeros((len(batch), *samples[batch[0]].shape[:-1], width), np.float32)
            for k, i in enumerate(batch):
                packed[k, ..., :samples[i].shape[-1]] = samples[i]
            batches.append(packed)
        how = f"width-sorted padded batches of {args.padded}, inexact"
    else:
        batches = [x[None] for x in samples]
        how = "one by one, exact"

    def run():
        for b in batches:
            s.run(None, {name: b})

    run()
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        run()
        times.append(1e3 * (time.perf_counter() - start))
    shapes = sorted({x.shape[1:] for x in samples})
    print(f"ONNX Runtime {ort.__version__} {how}, {len(samples)} samples "
          f"({len(shapes)} shapes, {shapes[0]}..{shapes[-1]}), {args.threads} threads: "
          f"median {np.median(times):.1f} ms of {', '.join('%.1f' % t for t in times)}")


if __name__ == "__main__":
    main()
