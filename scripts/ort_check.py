#!/usr/bin/env python3
"""Compare `tract-ragged run` results with ONNX Runtime run on each sample alone.

    tract-ragged run MODEL --ragged x:3 --samples IN.npz --out OUT.npz
    python3 scripts/ort_check.py MODEL IN.npz OUT.npz [--tol 1e-4] [--ctc] [--batch-axes 0,1]

Each sample of IN.npz goes alone (batch of one) through ONNX Runtime's CPU provider (for a
model of several inputs, IN.npz holds `s{i}.{input}` per sample and `shared.{input}`); every
output j of sample i is compared with OUT.npz's `s{i}_o{j}` (shapes must match exactly:
the ragged result is cropped to what the sample alone gives; ONNX Runtime's batch of one
is taken at `--batch-axes`, one per output, 0 by default). The difference is
|ours - ORT| / max(1, max |ORT|). `--ctc` also compares the greedy CTC decoding (argmax
over the last axis, repeats merged, blank 0) of output 0, as PP-OCR's recogniser uses it.
Exits 1 when a shape differs, a difference exceeds --tol or a CTC text differs; 2 when
ONNX Runtime cannot run the model (it does not implement every ONNX attribute combination,
e.g. SAME padding with dilations).
Needs numpy and onnxruntime (pip install onnxruntime).
"""
import argparse
import sys

import numpy as np
import onnxruntime as ort


def ctc(probs):
    best = probs.argmax(-1)
    keep = (best != 0) & np.concatenate([[True], best[1:] != best[:-1]])
    return best[keep].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("samples")
    ap.add_argument("outputs")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--ctc", action="store_true")
    ap.add_argument("--batch-axes", default="", help="the batch axis of each output")
    ap.add_argument(
        "--input-batch-axes",
        default="",
        help="INPUT=AXIS,...: where a per-sample input takes its batch axis (default 0)",
    )
    args = ap.parse_args()

    samples = np.load(args.samples)
    ours = np.load(args.outputs)
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT's own limits (layout 1 recurrences, say), not ours
        print(f"ONNX Runtime cannot load the model: {str(e).splitlines()[0]}")
        sys.exit(2)
    name = session.get_inputs()[0].name
    # A model of several inputs: arrays `s{i}.{input}` per sample (a batch axis added),
    # `shared.{input}` given as they are.
    several = any("." in k for k in samples.files)
    shared = {k[len("shared."):]: samples[k] for k in samples.files if k.startswith("shared.")}
    if several:
        at = dict(kv.split("=") for kv in args.input_batch_axes.split(",") if kv)
        groups = {}
        for k in samples.files:
            if k.startswith("shared."):
                continue
            i, inp = k[1:].split(".", 1)
            groups.setdefault(int(i), {})[inp] = np.expand_dims(samples[k], int(at.get(inp, 0)))
        feeds = [dict(groups[i], **shared) for i in sorted(groups)]
    else:
        feeds = [{name: samples[key][None]} for key in samples.files]
    worst, at, bad = 0.0, None, []
    for i, feed in enumerate(feeds):
        try:
            refs = session.run(None, feed)
        except Exception as e:  # ORT's own limits, not ours
            print(f"ONNX Runtime cannot run sample {i}: {str(e).splitlines()[0]}")
            sys.exit(2)
        axes = [int(a) for a in args.batch_axes.split(",") if a]
        for j, ref in enumerate(refs):
            ref = np.take(ref, 0, axis=axes[j] if j < len(axes) else 0)
            got = ours[f"s{i}_o{j}"]
            if got.shape != ref.shape:
                bad.append(f"sample {i} output {j}: shape {got.shape}, ORT {ref.shape}")
                continue
            if ref.size == 0:
                continue
            d = float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))
            if d > worst:
                worst, at = d, (i, j)
            if d > args.tol:
                bad.append(f"sample {i} output {j}: difference {d:.2e} > {args.tol:.0e}")
            if args.ctc and j == 0 and ctc(got) != ctc(ref):
                bad.append(f"sample {i}: CTC text differs")
    print(f"{len(feeds)} samples: max difference {worst:.2e} (sample, output {at})")
    for line in bad:
        print("  " + line)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
