"""tract-ragged's exact scheduled run on the CPU against ONNX Runtime's on the same lines,
in one run.

    python benches/ort_cpu.py MODEL LINES_DIR [--repeat K] [--threads T] [--batch B] [--runs N]

Lines are the PNG images of LINES_DIR (benches/lines.py), repeated K times. Rows, each the
median of N runs in this process, T threads each:
- ONNX Runtime one by one (its CPU provider, T intra-op threads): exact;
- ONNX Runtime on width-sorted batches of B padded with zeros (what RapidOCR and PaddleOCR
  do): inexact, the lines whose greedy CTC text then differs from alone are counted;
- tract-ragged scheduled (`Model.run` on the CPU runtime, T lanes): exact.
Each row's time is given against ONNX Runtime's padded batches (the speed issue's goal for
tract-ragged: at most 0.7 of it). Needs the wheel installed (scripts/python.sh) and
onnxruntime (pip install onnxruntime).
"""

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import tract_ragged
from lines import lines as read_lines


def timed(runs, f):
    times = []
    out = None
    for _ in range(runs):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, out


def ctc(probs):
    best = probs.argmax(-1)
    keep = (best != 0) & np.concatenate([[True], best[1:] != best[:-1]])
    return best[keep].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("lines")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    lines = read_lines(args.lines, args.repeat)
    n = len(lines)

    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def ort_alone():
        return [session.run(None, {name: x[None]})[0][0] for x in lines]

    order = sorted(range(n), key=lambda i: lines[i].shape[-1])

    def ort_padded():
        # Each line's output cropped to what its width gives alone (the output's time axis
        # is the width over the model's stride, as one by one shows).
        out = [None] * n
        for at in range(0, n, args.batch):
            batch = order[at:at + args.batch]
            width = max(lines[i].shape[-1] for i in batch)
            packed = np.zeros((len(batch), *lines[batch[0]].shape[:-1], width), np.float32)
            for k, i in enumerate(batch):
                packed[k, ..., :lines[i].shape[-1]] = lines[i]
            probs = session.run(None, {name: packed})[0]
            for k, i in enumerate(batch):
                out[i] = probs[k]
        return out

    model = tract_ragged.Model(args.model, "x:3", input_fact="N,3,48,W,f32", lanes=args.threads)
    model.run(lines)  # its plans and measured costs

    alone_ms, alone = timed(args.runs, ort_alone)
    padded_ms, padded = timed(args.runs, ort_padded)
    ours_ms, ours = timed(args.runs, lambda: model.run(lines))

    differ = sum(ctc(p[:len(a)]) != ctc(a) for p, a in zip(padded, alone))
    worst = max(float(np.abs(o[0] - a).max()) for o, a in zip(ours, alone))
    print(f"{n} lines ({n // args.repeat} x {args.repeat}), widths {min(x.shape[-1] for x in lines)}.."
          f"{max(x.shape[-1] for x in lines)}, {args.threads} threads, onnxruntime {ort.__version__}, "
          f"median of {args.runs} runs")
    print(f"{'':<52} {'ms':>9} {'lines/s':>8} {'vs padded':>9}")
    for row, ms in [
        ("ONNX Runtime one by one, exact", alone_ms),
        (f"ONNX Runtime width-sorted padded batches of {args.batch}, inexact", padded_ms),
        ("tract-ragged scheduled, exact (cpu)", ours_ms),
    ]:
        print(f"{row:<52} {ms:>9.1f} {n / ms * 1e3:>8.1f} {ms / padded_ms:>9.2f}")
    print(f"padded batches: greedy CTC text differs from alone on {differ}/{n} lines; "
          f"tract-ragged against ONNX Runtime alone: largest |difference| {worst:.2e}")


if __name__ == "__main__":
    sys.exit(main())
