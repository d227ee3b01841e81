#!/usr/bin/env python3
"""Run a zoo of exported models through `tract-ragged run`, one by one and as ragged
batches, each checked against ONNX Runtime run on each sample alone (scripts/ort_check.py).

    python3 scripts/zoo_check.py ZOO_DIR [--bin target/debug/tract-ragged] [--runtime cpu]
        [--tol 1e-4] [--refused FILE] [ID...]

`--bin` is a command, split as a shell splits it (the GPU bundle's launcher:
`--bin "bash .gpu-bundle/run.sh bin tract-ragged"`).

ZOO_DIR/manifest.json lists the models (../shared/zoo has 20: transformers encoders,
torchaudio nets, both torch exporters). Per model: `ragged` (INPUT:AXIS), `fact` (the
ragged input's fact, symbols for the batch and the ragged extents), `sizes` (one per
sample, the ragged extent), `extra` (the other inputs: `ones_like_ids`, the attention
mask; `zeros_like_ids`, token types), and for token models `vocab` (ids are drawn in
5..vocab-1; 1000 when not given). Samples are random: int64 ids, or standard normal
floats.

Prints one line per model and mode: `ok` with the run's time (loading, preparing and
running its samples) and ORT's verdict, or the last line of our
error (`ZOO_ERROR_CHARS` of it, 300 unless set). Exits 1 when a model ran but differs
from ONNX Runtime (a wrong result is worse than a refusal), when its samples' outputs
hardly differ from one another (`INSENSITIVE`: the check could not fail), and when `--refused FILE`
(ZOO_DIR/refused.json unless given) exists (`{"id": "why it is refused", ...}`: the models expected not to run in ragged
batches) and a model fails to run alone or a model it does not list is refused batched:
what ran must keep running. A listed model that runs is reported, to be taken off the
list.

A model may set its own `tol` in the manifest (deep float networks, whose sums ONNX
Runtime orders otherwise on CPUs without AVX-512). Dynamically quantized models (`_int8`)
are not compared with ONNX Runtime on a CPU without VNNI (neither `avx512_vnni` nor
`avx_vnni`): 8-bit dot products there go through AVX2's `vpmaddubsw`, whose 16-bit sums
saturate (the "saturation issue" OpenVINO documents), the likely reason ONNX Runtime 1.32
and tract-ragged differ by 1.2e-4 .. 6.2e-2 on a Zen 3 where they agree within 1e-4 on a
Zen 4 (the same for a build of 8814fe6 and of later commits); their ragged outputs are
checked against their outputs one by one instead, the contract itself.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))


def has_vnni():
    """Whether the CPU multiplies u8 x s8 into 32 bits without saturation (VNNI)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True
    return "avx512_vnni" in flags or "avx_vnni" in flags


def against_alone(ragged, alone, tol):
    """ort_check.py's verdict for ragged outputs against the same samples' outputs one by
    one: (exit code, lines)."""
    r, a = np.load(ragged), np.load(alone)
    if r.files != a.files:
        return 1, [f"outputs differ: {r.files} against {a.files}"]
    worst, bad = 0.0, []
    for name in r.files:
        if r[name].shape != a[name].shape:
            bad.append(f"{name}: shape {r[name].shape} against {a[name].shape}")
            continue
        got, ref = r[name].astype(np.float64), a[name].astype(np.float64)
        d = float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max()))) if ref.size else 0.0
        worst = max(worst, d)
        if d > tol:
            bad.append(f"{name}: difference {d:.2e} > {tol:.0e}")
    return (1 if bad else 0), [f"against one by one: max difference {worst:.2e}"] + bad


def sample(fact, size, rng, vocab=1000):
    *dims, dt = fact.split(",")
    shape = []
    for d in dims[1:]:
        shape.append(int(d) if d.isdigit() else size)
    if dt == "i64":
        return rng.integers(5, vocab, size=shape).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32)


def write_samples(model, path, rng):
    ragged = model["ragged"].split(":")[0]
    arrays = {}
    for i, size in enumerate(model["sizes"]):
        x = sample(model["fact"], size, rng, model.get("vocab", 1000))
        if not model["extra"]:
            arrays[f"s{i}"] = x
            continue
        arrays[f"s{i}.{ragged}"] = x
        for name, how in model["extra"].items():
            if how == "ones_like_ids":
                arrays[f"s{i}.{name}"] = np.ones_like(x)
            elif how == "zeros_like_ids":
                arrays[f"s{i}.{name}"] = np.zeros_like(x)
            else:
                raise SystemExit(f"{model['id']}: unknown extra input kind {how!r}")
    np.savez(path, **arrays)


def insensitive(out, tol):
    """Whether the outputs hardly depend on the input: for some output, every sample of
    one shape gives (within 10 x `tol`, relative to its scale as ort_check.py measures)
    what every other gives. A check against ONNX Runtime at `tol` could not tell a wrong
    batch from a right one there (a network of random weights whose activations fade)."""
    outs = np.load(out)
    by_output = {}
    for name in outs.files:
        sample, output = name[1:].split("_o")
        by_output.setdefault(int(output), []).append(outs[name])
    for arrays in by_output.values():
        by_shape = {}
        for a in arrays:
            by_shape.setdefault(a.shape, []).append(a.astype(np.float64))
        groups = [g for g in by_shape.values() if len(g) >= 2 and g[0].size > 0]
        if not groups:
            continue
        spread = max(float(np.abs(a - g[0]).max() / max(1.0, float(np.abs(g[0]).max())))
                     for g in groups for a in g[1:])
        if spread <= 10 * tol:
            return True
    return False


def first_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:int(os.environ.get("ZOO_ERROR_CHARS", "300"))] if lines else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("zoo")
    ap.add_argument("ids", nargs="*")
    ap.add_argument("--bin", default="target/debug/tract-ragged")
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--refused")
    args = ap.parse_intermixed_args()
    manifest = json.load(open(os.path.join(args.zoo, "manifest.json")))
    expected = args.refused or os.path.join(args.zoo, "refused.json")
    refused = json.load(open(expected)) if os.path.exists(expected) else None
    wrong = regressed = 0
    vnni = has_vnni()
    with tempfile.TemporaryDirectory() as work:
        for model in manifest["models"]:
            if args.ids and model["id"] not in args.ids:
                continue
            path = os.path.join(args.zoo, model["file"])
            if not os.path.exists(path):
                continue
            tol = float(model.get("tol", args.tol))
            # ONNX Runtime is not the reference there (module doc).
            no_ort = model["id"].endswith("_int8") and not vnni
            samples = os.path.join(work, model["id"] + ".npz")
            write_samples(model, samples, np.random.default_rng(0))
            for mode, extra in [("alone", ["--one-by-one"]), ("ragged", [])]:
                out = os.path.join(work, f"{model['id']}.{mode}.npz")
                started = time.monotonic()
                run = subprocess.run(
                    shlex.split(args.bin) + ["run", path, "--ragged", model["ragged"], "--input-fact",
                     model["fact"], "--runtime", args.runtime, "--samples", samples,
                     "--out", out] + extra,
                    capture_output=True, text=True)
                took = f"{time.monotonic() - started:.1f} s"
                if run.returncode != 0:
                    print(f"{model['id']:32} {mode:6} refused: {first_line(run.stderr)}")
                    if refused is not None and (mode == "alone" or model["id"] not in refused):
                        regressed += 1
                        print(f"{model['id']:32} {mode:6} REGRESSED: it ran before "
                              f"({os.path.basename(expected)} does not list it)")
                    continue
                if refused is not None and mode == "ragged" and model["id"] in refused:
                    print(f"{model['id']:32} {mode:6} runs now: take it off {expected}")
                if no_ort and mode == "alone":
                    print(f"{model['id']:32} {mode:6} ran ({took}); not against ONNX Runtime: "
                          "no VNNI on this CPU (module doc)")
                    continue
                if no_ort:
                    code, lines = against_alone(out, os.path.join(work, f"{model['id']}.alone.npz"), tol)
                    check = subprocess.CompletedProcess([], code, "\n".join(lines), "")
                else:
                    check = subprocess.run(
                        [sys.executable, os.path.join(here, "ort_check.py"), path, samples, out,
                         "--tol", str(tol)],
                        capture_output=True, text=True)
                verdict = " | ".join(check.stdout.strip().splitlines()[:3])
                if check.returncode == 1:
                    wrong += 1
                    print(f"{model['id']:32} {mode:6} WRONG: {verdict}")
                elif check.returncode == 2:
                    print(f"{model['id']:32} {mode:6} ran; ORT cannot: {verdict}")
                elif insensitive(out, tol):
                    wrong += 1
                    print(f"{model['id']:32} {mode:6} INSENSITIVE: its samples' outputs hardly "
                          f"differ, so this check cannot fail: {verdict}")
                else:
                    print(f"{model['id']:32} {mode:6} ok ({took}): {verdict}")
            sys.stdout.flush()
    sys.exit(1 if wrong or regressed else 0)


if __name__ == "__main__":
    main()
