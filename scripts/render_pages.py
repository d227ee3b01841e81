#!/usr/bin/env python3
"""Render the project's page fixtures: RGB PNGs of text on backgrounds, for text detectors
(DBNet: PP-OCRv4 det), in fixtures/pages/.

Sizes are multiples of 32 from 320 to 1280 on each side, as DBNet's preprocessing sizes
its input, all different, so that one batch mixes pages of very different heights and
widths. Backgrounds vary (white, paper-like gradient, a coloured band, light noise);
text comes in several sizes, fonts and colours, some lines near the right and bottom
edges, which is where padding leaks into a padded batch. Deterministic: re-running
reproduces the committed files.

    python3 scripts/render_pages.py      # needs Pillow and the DejaVu fonts
"""
import os
import random

from PIL import Image, ImageDraw, ImageFont

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "pages")
FONTS = "/usr/share/fonts/truetype/dejavu"

SIZES = [(320, 480), (416, 320), (352, 640), (640, 448), (480, 800), (736, 576), (960, 704), (1280, 896)]
FONT_FILES = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSans-Bold.ttf", "DejaVuSansMono.ttf",
              "DejaVuSansCondensed.ttf", "DejaVuSerif-Italic.ttf"]
WORDS = ("invoice total amount due date account number reference order shipping address "
         "batch padding width height page line text model exact sample detector pyramid "
         "receipt 2026 12 01 EUR 1,284.50 42 ID-8842 www.example.org tel +33 1 45 67 89").split()


def background(rng, w, h):
    kind = rng.randrange(4)
    img = Image.new("RGB", (w, h), (255, 255, 255))
    d = ImageDraw.Draw(img)
    if kind == 1:  # paper-like vertical gradient
        for y in range(h):
            v = 250 - int(20 * y / h)
            d.line([(0, y), (w, y)], fill=(v, v - 4, v - 12))
    elif kind == 2:  # a coloured band
        d.rectangle([0, h // 3, w, h // 3 + h // 5], fill=(200, 225, 245))
    elif kind == 3:  # light noise
        px = img.load()
        for y in range(0, h, 2):
            for x in range(0, w, 2):
                v = 235 + rng.randrange(20)
                px[x, y] = (v, v, v)
    return img


def render(i, w, h):
    rng = random.Random(1000 + i)
    img = background(rng, w, h)
    d = ImageDraw.Draw(img)
    y = rng.randrange(4, 24)
    while y < h - 8:
        size = rng.choice([14, 18, 22, 28, 36])
        font = ImageFont.truetype(os.path.join(FONTS, rng.choice(FONT_FILES)), size)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 9)))
        x = rng.randrange(4, max(5, w // 3))
        colour = rng.choice([(20, 20, 30), (40, 40, 120), (120, 20, 20), (60, 60, 60)])
        d.text((x, y), text, font=font, fill=colour)
        y += size + rng.randrange(6, 30)
    # A word at the right edge and one at the bottom edge.
    font = ImageFont.truetype(os.path.join(FONTS, "DejaVuSans-Bold.ttf"), 24)
    d.text((w - 90, h // 2), "EDGE", font=font, fill=(10, 10, 10))
    d.text((w // 2, h - 30), "bottom", font=font, fill=(10, 10, 10))
    return img


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, (w, h) in enumerate(SIZES):
        render(i, w, h).save(os.path.join(OUT, f"page{i:02}.png"), optimize=True)


if __name__ == "__main__":
    main()
