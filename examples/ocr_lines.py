"""PP-OCRv4 rec from Python: the text of each line image in a folder, every line batched
with the others exactly as it reads alone.

    pip install tract_ragged-*.whl pillow
    python examples/ocr_lines.py fixtures/lines assets/ppocr/ch_PP-OCRv4_rec_infer.onnx [cuda]
"""

import pathlib
import sys

import numpy as np
from PIL import Image

import tract_ragged


def line(path):
    """PaddleOCR's recogniser input: height 48, any width, CHW, in [-1, 1]."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    img = np.asarray(img.resize((max(1, round(w * 48 / h)), 48), Image.BILINEAR))
    return ((img.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1).copy()


def main():
    folder, model_path = pathlib.Path(sys.argv[1]), sys.argv[2]
    runtime = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    # top_k=1: each step's best class and its probability, computed where the model runs.
    model = tract_ragged.Model(model_path, "x:3", input_fact="N,3,48,W,f32",
                               runtime=runtime, top_k=1)
    classes = [""] + model.metadata["character"].splitlines() + [" "]
    paths = sorted(folder.glob("*.png"))
    for path, (_, best) in zip(paths, model.run([line(p) for p in paths])):
        chars, last = [], -1
        for c in best.reshape(-1):
            if c != last and c != 0:
                chars.append(classes[c])
            last = c
        print(f"{path.name}\t{''.join(chars)}")


if __name__ == "__main__":
    main()
