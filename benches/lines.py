"""Text lines as PP-OCR rec reads them, for the Python benches: each PNG image of a folder
resized to height 48 (width in proportion), RGB scaled to [-1, 1], as a (3, 48, W) float32
array."""

import pathlib

import numpy as np
from PIL import Image


def line(path):
    img = Image.open(path).convert("RGB")
    w = max(1, round(img.width * 48 / img.height))
    img = np.asarray(img.resize((w, 48)), np.float32)
    return ((img / 255 - 0.5) / 0.5).transpose(2, 0, 1).copy()


def lines(folder, repeat=1):
    """The folder's PNG lines in name order, the whole list `repeat` times."""
    return [line(p) for p in sorted(pathlib.Path(folder).glob("*.png"))] * repeat
