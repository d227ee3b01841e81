#!/usr/bin/env python3
"""The README's benchmark table, from one run of benches/gpu.sh.

    python3 benches/table.py OUT [--readme README.md]

OUT is the folder benches/gpu.sh wrote its logs to ($OUT of the device call): gpu.txt
(the device, nvidia-smi's), date.txt and commit.txt (when and what ran), bench.log
(`tract-ragged bench` on the 112 fixture lines) and torch.log (PyTorch + cuDNN on the same
lines, ../shared/gpu/torch_anchor.py). Every row of both logs goes in, as printed, in the
same run: the table is never edited by hand. With --readme, the table replaces what lies
between the README's `<!-- benchmark:begin -->` and `<!-- benchmark:end -->` lines;
without, it is printed.
"""
import argparse
import pathlib
import re
import sys

BEGIN, END = "<!-- benchmark:begin -->", "<!-- benchmark:end -->"


def read(out: pathlib.Path, name: str) -> str:
    path = out / name
    if not path.exists():
        sys.exit(f"{path} is missing: run benches/gpu.sh with STEPS including bench and torch")
    return path.read_text()


def table(out: pathlib.Path) -> str:
    gpu = [l for l in read(out, "gpu.txt").splitlines() if l.strip()]
    device = gpu[-1].split(",") if len(gpu) >= 2 else ["?"]
    name, driver = device[0].strip(), (device[1].strip() if len(device) > 1 else "?")
    date, commit = read(out, "date.txt").strip(), read(out, "commit.txt").strip()
    bench = read(out, "bench.log")
    header = next((l for l in bench.splitlines() if " samples, widths " in l), "")
    rows = []
    # `bench` rows: NAME, ms, lines/s, the ratio to its first row.
    for line in bench.splitlines():
        m = re.match(r"^(\S.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
        if m and not line.startswith(" "):
            rows.append((m.group(1).strip(), float(m.group(2)), float(m.group(3))))
    for line in read(out, "torch.log").splitlines():
        m = re.match(r"^torch (\S+) (.*?)\s+([\d.]+) ms\s+([\d.]+) samples/s$", line)
        if m:
            rows.append((f"PyTorch {m.group(1)}, {m.group(2).strip()}", float(m.group(3)),
                         float(m.group(4))))
    if not rows:
        sys.exit("no rows found in bench.log and torch.log")
    what = re.sub(r"^\S+: ", "", header)
    lines = [
        f"{name}, driver {driver}, {date}, commit {commit} (`benches/gpu.sh`, "
        f"`benches/table.py`): PP-OCRv4 rec, {what}. Times end to end, host tensors in and "
        "out (PyTorch leaves its outputs on the device); exact rows give each line what it "
        "gets alone.",
        "",
        "| | ms | lines/s |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {n} | {ms:.1f} | {per:.0f} |" for n, ms, per in rows]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--readme", type=pathlib.Path)
    args = parser.parse_args()
    text = table(args.out)
    if args.readme is None:
        print(text, end="")
        return
    readme = args.readme.read_text()
    if BEGIN not in readme or END not in readme:
        sys.exit(f"{args.readme} has no {BEGIN} ... {END} block")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.readme.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


if __name__ == "__main__":
    main()
