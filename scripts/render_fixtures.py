#!/usr/bin/env python3
"""Render the project's text-line fixtures: RGB PNGs of height 48 (PP-OCR rec's input height),
one line of text each, with their texts in fixtures/lines/texts.tsv.

The lines are deterministic (fixed texts, fonts and sizes) so that re-running this script
reproduces the committed files. Widths span 60..1600 px so that one batch mixes very
different widths, which is exactly where naive padding leaks into the results.

    python3 scripts/render_fixtures.py      # needs Pillow and the DejaVu fonts
"""
import os
from PIL import Image, ImageDraw, ImageFont

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "lines")
FONTS = "/usr/share/fonts/truetype/dejavu"

LINES = [
    ("DejaVuSans.ttf", "Invoice 2024-117"),
    ("DejaVuSerif.ttf", "Total due: 1,284.50 EUR"),
    ("DejaVuSans-Bold.ttf", "OK"),
    ("DejaVuSansMono.ttf", "ID 8842"),
    ("DejaVuSans.ttf", "The quick brown fox jumps over the lazy dog"),
    ("DejaVuSerif.ttf", "Please return the signed copy before Friday, 12 March."),
    ("DejaVuSansCondensed.ttf", "Batching lines of different widths must not change the text."),
    ("DejaVuSans.ttf", "Tel. +33 1 45 67 89 10"),
    ("DejaVuSerif-Bold.ttf", "CHAPTER 7"),
    ("DejaVuSans.ttf", "www.example.org/docs/ocr"),
    ("DejaVuSansMono.ttf", "SKU-0042-XL   qty 3   unit 19.99"),
    ("DejaVuSans-Oblique.ttf", "handwritten notes are harder"),
    ("DejaVuSerif.ttf", "Paris"),
    ("DejaVuSans.ttf", "Account number: FR76 3000 6000 0112 3456 7890 189"),
    ("DejaVuSansCondensed-Bold.ttf", "WARNING: HIGH VOLTAGE"),
    ("DejaVuSans.ttf", "a"),
    ("DejaVuSerif.ttf", "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor."),
    ("DejaVuSans.ttf", "2026-11-30 06:23:23 UTC"),
    ("DejaVuSansMono.ttf", "fn main() { println!(\"hello\"); }"),
    ("DejaVuSans.ttf", "Shipping address: 221B Baker Street, London NW1 6XE, United Kingdom"),
    ("DejaVuSerif-Italic.ttf", "Yours sincerely,"),
    ("DejaVuSans.ttf", "42"),
    ("DejaVuSans-Bold.ttf", "Net weight 500 g"),
    ("DejaVuSansCondensed.ttf", "Results identical to one-by-one inference, at batched speed, on CPU and CUDA alike."),
    ("DejaVuSans.ttf", "Page 3 of 12"),
    ("DejaVuSerif.ttf", "Dear Dr. Smith,"),
    ("DejaVuSansMono.ttf", "ERR_CONNECTION_RESET"),
    ("DejaVuSans.ttf", "Speech and text lines vary in length; padding them to the widest one leaks."),
]


def render(font_file, text, size=30, height=48):
    font = ImageFont.truetype(os.path.join(FONTS, font_file), size)
    left, top, right, bottom = font.getbbox(text)
    margin = 8
    w = right - left + 2 * margin
    h = bottom - top + 2 * margin
    img = Image.new("RGB", (w, h), (255, 255, 255))
    ImageDraw.Draw(img).text((margin - left, margin - top), text, font=font, fill=(20, 20, 30))
    # PP-OCR rec preprocessing: height 48, aspect ratio kept.
    width = max(1, round(w * height / h))
    return img.resize((width, height), Image.BILINEAR)


def main():
    os.makedirs(OUT, exist_ok=True)
    rows = []
    for i, (font, text) in enumerate(LINES):
        name = f"line{i:02}.png"
        render(font, text).save(os.path.join(OUT, name), optimize=True)
        rows.append(f"{name}\t{text}")
    with open(os.path.join(OUT, "texts.tsv"), "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
