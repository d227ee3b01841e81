#!/usr/bin/env python3
"""Int8 twins of a zoo's text encoders, quantized dynamically as ONNX Runtime's
`quantize_dynamic` does (int8 weights; each activation quantized before its
`MatMulInteger` by a `DynamicQuantizeLinear` over the whole tensor), as optimum's int8
exports of sentence encoders are. Adds `<id>_int8.onnx` and its manifest entry for each.

    python3 scripts/zoo/quantize.py ZOO_DIR [ID...]

Runs here (onnxruntime from PyPI); deterministic. Only the text encoders exported by the
TorchScript exporter: their dynamo twins quantize alike, and the audio models' quantized
convolutions (`ConvInteger`) differ between tract and ONNX Runtime even alone.
"""
import json
import os
import sys

from onnxruntime.quantization import QuantType, quantize_dynamic


def main():
    zoo, ids = sys.argv[1], set(sys.argv[2:])
    path = os.path.join(zoo, "manifest.json")
    manifest = json.load(open(path))
    models = [m for m in manifest["models"] if not m["id"].endswith("_int8")]
    added = []
    for m in models:
        text = m["id"].startswith("hf_") and m["fact"] == "N,L,i64" and not m["id"].endswith("_dyn")
        if not text or (ids and m["id"] not in ids):
            continue
        q = dict(m, id=m["id"] + "_int8", file=m["id"] + "_int8.onnx")
        quantize_dynamic(os.path.join(zoo, m["file"]), os.path.join(zoo, q["file"]),
                         weight_type=QuantType.QInt8)
        q["task"] = m["task"] + ", int8 (quantize_dynamic)"
        added.append(q)
    kept = [m for m in manifest["models"] if m["id"] not in {q["id"] for q in added}]
    manifest["models"] = kept + added
    json.dump(manifest, open(path, "w"), indent=1)
    print(" ".join(q["id"] for q in added))


if __name__ == "__main__":
    main()
