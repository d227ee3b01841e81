#!/usr/bin/env python3
"""A CRNN text recogniser in PyTorch, as users export one: a conv stack (batch norm, ReLU,
max pools) bringing a 3x48xW line to 256 features x W/4 columns, the columns as a
sequence (sequence first), a stacked bidirectional LSTM or GRU, a linear layer, a softmax.

    python3 benches/crnn.py export OUT.onnx [--cell lstm|gru] [--hidden 256] [--layers 2]
        [--channels 32,64,128,256] [--batch-first]
    python3 benches/crnn.py time SAMPLES.npz [same model options] [--batch 32]

`export` writes the ONNX model (torch.onnx.export, TorchScript exporter, opset 17, batch
and width dynamic) with weights drawn from `--seed`. `time` builds the same model on the
GPU and times it on the samples (CHW float32 arrays, as `tract-ragged bench
--save-samples` writes them), median of 5 runs, in the layout of torch_anchor.py:
  - padded, width-sorted batches (what everybody does; inexact: the padding reaches the
    convolutions and the recurrence),
  - the same with packed sequences (pack_padded_sequence: the recurrence runs each line to
    its own length, the convolutions still read the padding),
  - one by one (exact).
Outputs stay on the device. Needs torch (and onnx for export).
"""
import argparse
import sys

import numpy as np
import torch
from torch import nn


class CRNN(nn.Module):
    def __init__(self, cell, hidden, layers, channels=(32, 64, 128, 256), batch_first=False, classes=97):
        super().__init__()
        c1, c2, c3, c4 = channels
        self.batch_first = batch_first

        def block(cin, cout, pool):
            layers = [nn.Conv2d(cin, cout, 3, 1, 1), nn.BatchNorm2d(cout), nn.ReLU()]
            return layers + ([nn.MaxPool2d(pool, pool)] if pool else [])

        self.cnn = nn.Sequential(
            *block(3, c1, (2, 2)),
            *block(c1, c2, (2, 2)),
            *block(c2, c3, (2, 1)),
            nn.Conv2d(c3, c4, (6, 1)),
            nn.BatchNorm2d(c4),
            nn.ReLU(),
        )
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(c4, hidden, num_layers=layers, bidirectional=True, batch_first=batch_first)
        self.fc = nn.Linear(2 * hidden, classes)

    def features(self, x):
        # [N, C, 1, W/4] -> [W/4, N, C], or [N, W/4, C] batch first
        f = self.cnn(x).squeeze(2)
        return f.permute(0, 2, 1) if self.batch_first else f.permute(2, 0, 1)

    def head(self, y):
        p = self.fc(y).softmax(-1)
        return p if self.batch_first else p.permute(1, 0, 2)

    def forward(self, x):
        y, _ = self.rnn(self.features(x))
        return self.head(y)


def build(args):
    torch.manual_seed(args.seed)
    channels = tuple(int(c) for c in args.channels.split(","))
    model = CRNN(args.cell, args.hidden, args.layers, channels, args.batch_first).eval()
    # Batch norm statistics other than the defaults, so that it is not the identity.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model


def export(args):
    model = build(args)
    x = torch.randn(2, 3, 48, 160)
    torch.onnx.export(
        model,
        x,
        args.out,
        input_names=["x"],
        output_names=["probs"],
        dynamic_axes={"x": {0: "N", 3: "W"}, "probs": {0: "N", 1: "T"}},
        opset_version=17,
        dynamo=False,
    )
    print(f"crnn {args.cell} hidden {args.hidden} x{args.layers} channels {args.channels} written to {args.out}")


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def time(args):
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build(args).to(dev)
    d = np.load(args.samples)
    lines = sorted((d[k].astype(np.float32) for k in d.files), key=lambda a: a.shape[2])
    bs = args.batch

    def pad(batch):
        w = max(a.shape[2] for a in batch)
        x = np.zeros((len(batch), 3, 48, w), np.float32)
        for j, a in enumerate(batch):
            x[j, :, :, : a.shape[2]] = a
        return torch.from_numpy(x).to(dev)

    batches = [lines[i : i + bs] for i in range(0, len(lines), bs)]

    def padded():
        return [model(pad(b)) for b in batches]

    def packed():
        out = []
        for b in batches:
            f = model.features(pad(b))
            lengths = [a.shape[2] // 4 for a in b]
            bf = model.batch_first
            p = nn.utils.rnn.pack_padded_sequence(f, lengths, batch_first=bf, enforce_sorted=False)
            y, _ = model.rnn(p)
            y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=bf)
            out.append(model.head(y))
        return out

    def one_by_one():
        return [model(torch.from_numpy(a[None]).to(dev)) for a in lines]

    n = len(lines)
    with torch.inference_mode():
        for name, fn in [
            (f"padded, width-sorted batches of {bs}", padded),
            (f"packed sequences, width-sorted batches of {bs}", packed),
            ("one by one", one_by_one),
        ]:
            ms = timed(fn)
            print(f"torch crnn {args.cell} fp32, {name}: {ms:.1f} ms, {n / ms * 1e3:.0f} lines/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["export", "time"])
    ap.add_argument("path", help="export: the ONNX file to write; time: the samples")
    ap.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--channels", default="32,64,128,256")
    ap.add_argument("--batch-first", action="store_true")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    if args.what == "export":
        args.out = args.path
        export(args)
    else:
        args.samples = args.path
        time(args)


if __name__ == "__main__":
    sys.exit(main())
