#!/usr/bin/env bash
# The Python package: build the wheel with maturin against the tract the tests compiled
# (the workspace's dev profile, dependencies optimised), install it in a virtual
# environment with numpy and pytest, and run python/tests. Part of scripts/test.sh.
#
#   scripts/python.sh [pytest args]
#
# The venv is .venv-python/ (ignored), kept between runs; maturin and the test
# dependencies come from PyPI the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-python
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.7,<2" numpy pytest \
  "ray[data]>=2.9" pillow "tritonclient[http,grpc]>=2.40"
rm -rf target/wheels-python
"$venv/bin/maturin" build --quiet --profile dev --manifest-path python/Cargo.toml \
  --out target/wheels-python
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps \
  target/wheels-python/tract_ragged-*.whl
# The CLI the tests compare with: the one cargo built beside the tests.
cargo build --quiet --bin tract-ragged
TRACT_RAGGED_BIN="${TRACT_RAGGED_BIN:-$PWD/target/debug/tract-ragged}" \
  "$venv/bin/python" -m pytest -q python/tests "$@"
# The README's Ray pipeline on the fixture lines (PP-OCRv4 rec, 2 actors on the CPU): the
# text of as many lines as one by one reads right (25 of 28, trimmed, as the demo counts).
out=$(mktemp -d)
"$venv/bin/python" examples/ray_lines.py fixtures/lines assets/ppocr/ch_PP-OCRv4_rec_infer.onnx \
  "$out/lines.parquet" >"$out/log" 2>&1 || { tail -20 "$out/log"; exit 1; }
"$venv/bin/python" - "$out/lines.parquet" <<'PY'
import sys
import pyarrow.parquet as pq
rows = pq.read_table(sys.argv[1]).to_pylist()
truth = dict(l.rstrip("\n").split("\t", 1) for l in open("fixtures/lines/texts.tsv"))
right = sum(r["text"].strip() == truth[r["path"].rsplit("/", 1)[-1]] for r in rows)
print(f"examples/ray_lines.py: {len(rows)} lines, {right} read right")
assert len(rows) == len(truth) and right >= 25, (len(rows), right)
PY
rm -rf "$out"
