"""tract-ragged's exact scheduled run of a text detector on the CPU against ONNX Runtime
one page at a time, on the same pages, in one run.

    python benches/ort_det.py MODEL PAGES.npz [--threads T] [--runs N]

PAGES.npz: one float32 CHW array per page, preprocessed (what `tract-ragged bench --pages
DIR --save-samples PAGES.npz` writes). Rows, each the median of N runs in this process, T
threads each: ONNX Runtime one by one (its CPU provider, T intra-op threads), exact, and
tract-ragged scheduled (`Model.run` on the CPU runtime, H and W ragged, T lanes), exact,
against ONNX Runtime's row (the speed issue's goal for detectors: at most 1.0). Needs the
wheel installed (scripts/python.sh) and onnxruntime (pip install onnxruntime).
"""

import argparse

import numpy as np
import onnxruntime as ort

import tract_ragged
from ort_cpu import timed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("pages")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    archive = np.load(a.pages)
    pages = [archive[k].astype(np.float32) for k in archive.files]
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(a.model, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    alone = lambda: [session.run(None, {name: p[None]})[0][0] for p in pages]
    alone()
    ort_ms, expected = timed(a.runs, alone)
    model = tract_ragged.Model(
        a.model, f"{name}:2,3", input_fact="N,3,H,W,f32", runtime="cpu", lanes=a.threads
    )
    ours = lambda: [o[0] for o in model.run(pages)]
    ours()
    our_ms, found = timed(a.runs, ours)
    worst = max(float(np.abs(f - e).max()) for f, e in zip(found, expected))
    sizes = ", ".join(f"{p.shape[1]}x{p.shape[2]}" for p in pages)
    print(f"{len(pages)} pages ({sizes}), {a.threads} threads, onnxruntime {ort.__version__}, median of {a.runs} runs")
    print(f"{'':50}{'ms':>10}{'vs ORT':>10}")
    print(f"{'ONNX Runtime one by one, exact':50}{ort_ms:10.1f}{1.0:10.2f}")
    print(f"{'tract-ragged scheduled, exact (cpu)':50}{our_ms:10.1f}{our_ms / ort_ms:10.2f}")
    print(f"tract-ragged against ONNX Runtime alone: largest |difference| {worst:.2e}")


if __name__ == "__main__":
    main()
