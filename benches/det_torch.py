# PyTorch + cuDNN timing of a text detector (PP-OCR det, DBNet) on pages of different
# sizes, the way a PyTorch user batches them: padded with zeros to the batch's largest
# height and width, and one page at a time. The reference rows for `benches/gpu.sh det`.
#
#   python3 benches/det_torch.py MODEL.onnx PAGES.npz [batch=8] [runs=5]
#
# PAGES.npz: one float32 CHW array per page, preprocessed (what `tract-ragged bench
# --pages DIR --save-samples` writes). Needs the onnx2torch wheel on PYTHONPATH.
import sys
import time

import numpy as np
import onnx
import torch
from onnx2torch import convert

model_path, pages_path = sys.argv[1], sys.argv[2]
bs = int(sys.argv[3]) if len(sys.argv) > 3 else 8
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
dev = "cuda"
d = np.load(pages_path)
pages = [d[k].astype(np.float32) for k in d.files]

m = onnx.load(model_path)
# onnx2torch wants weights as initializers; Paddle exports put them in Constant nodes.
keep = []
for n in m.graph.node:
    if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
        t = onnx.TensorProto()
        t.CopyFrom(n.attribute[0].t)
        t.name = n.output[0]
        m.graph.initializer.append(t)
    else:
        keep.append(n)
del m.graph.node[:]
m.graph.node.extend(keep)
net = convert(m).to(dev).eval()
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = False


def padded(batch):
    C = batch[0].shape[0]
    H = max(x.shape[1] for x in batch)
    W = max(x.shape[2] for x in batch)
    X = np.zeros((len(batch), C, H, W), np.float32)
    for j, x in enumerate(batch):
        X[j, :, : x.shape[1], : x.shape[2]] = x
    return torch.from_numpy(X).to(dev)


def timed(f):
    f()
    torch.cuda.synchronize()
    best = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        best.append(time.perf_counter() - t)
    return sorted(best)[len(best) // 2] * 1e3


# The batches in the order given, as `tract-ragged bench` cuts them.
batches = [pages[i : i + bs] for i in range(0, len(pages), bs)]


@torch.no_grad()
def run_padded():
    for b in batches:
        net(padded(b)).cpu()


@torch.no_grad()
def run_alone():
    for p in pages:
        net(torch.from_numpy(p[None]).to(dev)).cpu()


print(f"torch det padded (batch {bs}, fp32): {timed(run_padded):.1f} ms for {len(pages)} pages")
print(f"torch det one by one (fp32): {timed(run_alone):.1f} ms for {len(pages)} pages")
