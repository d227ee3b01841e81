#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: the CUDA tests, the benchmark tables
# (ragged-cuda against tract-cuda padded and one by one, the scheduler against the naive
# plan, the CPU), PyTorch + cuDNN on the same lines, a 1000-line CLI run checked against
# one by one, and per-node profiles of one batch of 32 on ragged-cuda and on the CPU.
#
# Here:  ../shared/gpu/bundle.sh --features cuda --test cuda --test it --test onnx_conformance
#        mkdir -p .gpu-extra && cp ../shared/gpu/torch_anchor.py .gpu-extra/ &&
#          pip download --no-deps onnx2torch==1.5.15 -d .gpu-extra
#        for `python` and `serve`, the release wheel and tritonclient's HTTP client:
#          maturin build --release --manifest-path python/Cargo.toml --out .gpu-extra &&
#          pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
#            manylinux_2_28_x86_64 (and the other manylinux tags) -d .gpu-extra tritonclient
#            python-rapidjson geventhttpclient gevent 'greenlet<3.4' zope.event
#            zope.interface brotli
# There: bash benches/gpu.sh   (carrying .gpu-bundle, .gpu-extra, assets/ppocr,
#        assets/onnx-node, and .gpu-cache once there is one). Logs land in $OUT.
# STEPS selects steps (default: all but zoofull and zoohost): tests zoo zoofull zoohost bench lanes bench1008 unfused nocublas torch fixed
# many profile latency soak crnn det python serve load ortcpu cpurows. (`python`: the wheel on ragged-cuda against
# the Rust API, benches/python_api.py. `serve`: the server under load, benches/serve.py.
# `load`: the server under Rust clients, benches/load.sh, with LOAD_OLD (another CLI
# command, e.g. an older CLI carried in .gpu-extra) loaded the same way for an A/B, and
# LOAD_GATHERERS (e.g. "2 4 8") a load per `serve --gatherers` count.
# `turns`: the lanes launching one at a time against at once (TRACT_RAGGED_TURNS=0), the
# server's gatherings offline and the server at 512 clients; not in the default steps.
# `pool`: the device memory pool handing a lane memory another lane freed, making it wait
# for that lane (CUDA's default) against not (TRACT_RAGGED_POOL_WAITS=0): the server's
# gatherings offline, then the server at 512 clients; not in the default steps.
# `gatherings`: the server's gatherings run offline, `bench --calls G --reshuffle` on the
# 1120 lines for G in GATHERINGS (112 224 448), graphs on and off, against one call: what
# the runs cost apart from the server around them; not in the default steps.
# `ortcpu`: the host's CPU against ONNX Runtime, benches/ort_cpu.py; not in the default steps.
# `cpurows`: det's pages and rec's lines on the host's CPU, every core and 2, against ONNX
# Runtime on the samples the CLI saved, benches/ort_saved.py (no wheel); not in the default steps.)
# (`scaling`: how the time grows with the lines, 112 to 112000 (SCALING_REPEATS), top 1, on
# ragged-cuda then the host's CPU (SCALING_CPU_REPEATS), and with one line's width, 50 to
# 5000 px, on ragged-cuda; an empty list skips its rows; not in the default steps.) (`lanes`: the 112-line bench with the scheduler's
# batches in LANES_LIST lanes. `topk`: the 112-line and 256 x 320 benches with outputs
# whole and reduced on the device to their top 1 and top 5. `precision`: the 112-line
# bench at --precision tf32 and f16 (PRECISIONS) with its accuracy against fp32 one by one,
# and the profile of the f16 batch of 32. `timeline`: each
# batch's upload, run and download of a scheduled run on the host's clock, bench --timeline.) (`det`: PP-OCRv4 det on the fixture pages, 4 copies,
# H and W ragged: ragged-cuda batches against one by one and tract-cuda padded, and
# PyTorch + cuDNN padded and one by one, benches/det_torch.py.) (`crnn`: CRNNs of realistic size exported from PyTorch by
# benches/crnn.py, 2-layer BiLSTM and BiGRU of hidden 256 over W/4, on the 112 fixture
# lines: ragged-cuda batches against one by one and tract-cuda, and PyTorch + cuDNN on the
# same lines and weights, padded, packed and one by one.) (`soak`: SOAK_BATCHES (10000) random batches of the fixture lines
# from 8 threads through one runnable, graphs on, every sample checked against its result
# alone, device memory sampled every 1000 batches; the `tests` step skips it.) (`fixed`: 256 lines of 320 px, one batch, ours against PyTorch.
# `nocublas`: the 112-line bench with TRACT_RAGGED_CUBLAS=0, 1x1 convolutions left to
# tract-cuda.)
# (`unfused`: the 112-line bench again with TRACT_RAGGED_FUSE=0, element-wise chains not
# fused, for the before/after of that pass in one run.)
# (`tractcli`: tract's own CLI with tract-ragged linked, built here by scripts/tract-cli.sh
# and carried xz-compressed as .gpu-extra/tractcli/tract.xz, on a ragged batch through
# `-t 'ragged(...)' --cuda -r ragged-cuda`, against tract-ragged run: scripts/tract-cli-check.sh.)
# (`ceiling`: the CPU runtime's 112 lines in one process on one core, then one process per
# core at once, then the scheduled row on every core: what the host's cores give, against
# what the lanes get. Not in the default steps: about 3 minutes.)
# The whole of it runs past one device call's 10 minutes: split it, e.g. STEPS=tests, then
# STEPS="bench unfused nocublas torch fixed profile latency" BENCH_CPU= .
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
STEPS=${STEPS:-tests zoo bench lanes topk precision bench1008 unfused nocublas torch fixed many profile latency soak crnn det}
MODEL=assets/ppocr/ch_PP-OCRv4_rec_infer.onnx
RAGGED=(--ragged x:3 --input-fact N,3,48,W,f32)
# The CLI's runs keep tract-cuda's own cuDNN convolutions (the padded and one-by-one
# reference rows) in f32 as ours are: cuDNN's default math type would put them on TF32.
# Not for the tests, which check that ours stay f32 with nothing in the environment, nor
# for PyTorch, whose TF32 row asks for TF32.
CLI=(env NVIDIA_TF32_OVERRIDE=0 timeout 300 bash .gpu-bundle/run.sh bin tract-ragged)
WIDTHS32=51,68,85,116,179,200,217,264,273,282,320,327,341,402,436,442,450,485,510,566,634,634,640,738,858,915,960,1052,1180,1213,1233,1324
step() { echo; echo "=== $* ($(date -u +%T))"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }

step gpu
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
# When and what ran, for benches/table.py: the bundle's commit, where the bundle says it.
date -u +%F > "$OUT/date.txt"
cp .gpu-bundle/commit.txt "$OUT/commit.txt" 2>/dev/null || echo unknown > "$OUT/commit.txt"

if want tests; then
  step tests
  # The CLI's tests run the bundle's CLI (run.sh unpacks it with the tests).
  TRACT_RAGGED_BIN=$PWD/.gpu-bundle/bin/tract-ragged \
    timeout "${TEST_SECONDS:-330}" bash .gpu-bundle/run.sh tests ${TEST_FILTER:---skip soak --skip preparation::} 2>&1 | tee "$OUT/tests.log" \
    | grep -E "^test |test result|panicked|relative|PP-OCR|out of memory|error|onnx conformance|FAILED|real models" | head -80
fi

if want zoofull; then
  # torchvision's classification families (the smallest of each) and segmentation models
  # at full size, exported here with random weights (scripts/zoo/export.py --full), one
  # by one and ragged on ragged-cuda against ONNX Runtime; each run's time (loading and
  # preparing included) in the log. ZOOFULL_IDS: only those (ids, e.g. tvf_resnet50).
  step zoo at full size on ragged-cuda
  timeout "${ZOOFULL_EXPORT_SECONDS:-240}" python3 scripts/zoo/export.py /tmp/zoofull --full \
    --torchscript-only --max-bytes 600000000 ${ZOOFULL_IDS:-} 2>&1 | grep -v -i warn \
    | tee "$OUT/zoofull-export.log"
  timeout "${ZOOFULL_SECONDS:-400}" python3 scripts/zoo_check.py /tmp/zoofull --runtime cuda \
    --bin "bash .gpu-bundle/run.sh bin tract-ragged" ${ZOOFULL_IDS:-} 2>&1 | tee "$OUT/zoofull.log"
fi

if want zoo; then
  # The exporters' zoo (fixtures/zoo, scripts/zoo/export.py) one by one and in ragged
  # batches on ragged-cuda, each sample against ONNX Runtime alone (ZOO_IDS: only those).
  step zoo on ragged-cuda
  timeout "${ZOO_SECONDS:-400}" python3 scripts/zoo_check.py fixtures/zoo --runtime cuda \
    --bin "bash .gpu-bundle/run.sh bin tract-ragged" ${ZOO_IDS:-} 2>&1 | tee "$OUT/zoo.log"
fi

if want zoohost; then
  # The zoo again with TRACT_RAGGED_DEVICE_ONLY=1: a plan leaving nodes on the host between
  # its syncs is refused, naming them; each model either runs on the device only or says
  # which nodes it leaves there (not in the default steps).
  step zoo on ragged-cuda, device only
  TRACT_RAGGED_DEVICE_ONLY=1 ZOO_ERROR_CHARS=2000 timeout "${ZOO_SECONDS:-400}" \
    python3 scripts/zoo_check.py fixtures/zoo --runtime cuda \
    --bin "bash .gpu-bundle/run.sh bin tract-ragged" ${ZOO_IDS:-} 2>&1 | tee "$OUT/zoohost.log"
fi

if want bench; then
  step bench, 112 lines
  "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat 4 --batch 32 \
    --runs 5 ${BENCH_CPU---cpu} --save-samples /tmp/lines.npz 2>&1 | tee "$OUT/bench.log"
fi

if want lanes; then
  # The scheduler's batches in 1..6 lanes (a thread and stream each, taking turns on the
  # device): what overlapping packing, upload, compute and download across batches is
  # worth, for CudaBackend's LANES; the 112 lines and 256 x 320 px, batches of at most 32
  # and 64 (TRACT_RAGGED_MAX_BATCH), medians of 15 runs without the padded rows.
  python3 -c "import numpy as np; r = np.random.default_rng(0); np.savez('/tmp/fixed.npz', **{f's{i:03}': r.uniform(-1, 1, (3, 48, 320)).astype(np.float32) for i in range(256)})"
  for lanes in ${LANES_LIST:-1 2 3 4 6}; do
    for most in 32 64; do
      step bench, 112 lines, $lanes lanes, batches of at most $most
      TRACT_RAGGED_MAX_BATCH=$most TRACT_RAGGED_LANES=$lanes "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda \
        --lines fixtures/lines --repeat 4 --batch 32 --runs 15 --no-one-by-one --no-padded 2>&1 \
        | grep -E "exact|lines/s" | tee -a "$OUT/lanes.log"
      step bench, 256 x 320, $lanes lanes, batches of at most $most
      TRACT_RAGGED_MAX_BATCH=$most TRACT_RAGGED_LANES=$lanes "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda \
        --samples /tmp/fixed.npz --batch 256 --runs 15 --no-one-by-one --no-padded 2>&1 \
        | grep -E "exact|lines/s" | tee -a "$OUT/lanes.log"
    done
  done
fi

if want topk; then
  # Outputs reduced on the device (--top-k 1: each step's best class and its probability,
  # what a CTC decoder reads) against whole probabilities brought back, same run.
  for k in "" 1 5; do
    step bench, 112 lines${k:+, --top-k $k}
    "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat 4 --batch 32 \
      --runs 7 --no-one-by-one ${k:+--top-k $k} 2>&1 | grep -E "exact|lines/s" | tee -a "$OUT/topk.log"
  done
  python3 -c "import numpy as np; r = np.random.default_rng(0); np.savez('/tmp/fixed.npz', **{f's{i:03}': r.uniform(-1, 1, (3, 48, 320)).astype(np.float32) for i in range(256)})"
  for k in "" 1; do
    step fixed 256 x 48 x 320, one batch${k:+, --top-k $k}
    "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/fixed.npz --batch 256 --runs 5 \
      --no-one-by-one ${k:+--top-k $k} 2>&1 | grep -E "exact|lines/s" | tee -a "$OUT/topk.log"
  done
fi

if want timeline; then
  # Where the wall clock of a scheduled run goes: each batch's upload, run (settled on the
  # stream) and download on the host's clock, in 1 and 4 lanes, for the 112 lines and the
  # 256 x 320 batch (whole outputs and top 1).
  python3 -c "import numpy as np; r = np.random.default_rng(0); np.savez('/tmp/fixed.npz', **{f's{i:03}': r.uniform(-1, 1, (3, 48, 320)).astype(np.float32) for i in range(256)})"
  for lanes in ${TIMELINE_LANES:-1 4}; do
    for k in "" 1; do
      step timeline, 112 lines, $lanes lanes${k:+, --top-k $k}
      TRACT_RAGGED_LANES=$lanes "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines \
        --repeat 4 --batch 32 --runs 5 --no-one-by-one --timeline ${k:+--top-k $k} 2>&1 | tee -a "$OUT/timeline.log"
    done
  done
  for k in "" 1; do
    step timeline, 256 x 320${k:+, --top-k $k}
    "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/fixed.npz --batch 256 --runs 5 \
      --no-one-by-one --timeline ${k:+--top-k $k} 2>&1 | tee -a "$OUT/timeline.log"
  done
fi

if want precision; then
  # TF32 on our convolutions and 1x1 GEMMs, and the model in f16, each with the accuracy
  # against fp32 one by one. Without NVIDIA_TF32_OVERRIDE=0, which would turn TF32 off in
  # the whole process. Then the profile of the f16 batch of 32.
  for p in ${PRECISIONS:-tf32 f16}; do
    step bench, 112 lines, --precision $p
    timeout 300 bash .gpu-bundle/run.sh bin tract-ragged bench "$MODEL" "${RAGGED[@]}" --runtime cuda \
      --lines fixtures/lines --repeat 4 --batch 32 --runs 7 --no-one-by-one --precision $p 2>&1 \
      | grep -E "exact|lines/s|accuracy|f16|tf32|rror" | tee -a "$OUT/precision.log"
  done
  step profile, f16, one batch of 32
  "${CLI[@]}" profile "$MODEL" "${RAGGED[@]}" --runtime cuda --widths $WIDTHS32 --runs 3 --precision f16 \
    >"$OUT/profile-cuda-f16.log" 2>&1
  head -30 "$OUT/profile-cuda-f16.log"
  grep -A25 "^by op" "$OUT/profile-cuda-f16.log" | head -24
fi

if want unfused; then
  step bench, 112 lines, element-wise chains not fused
  TRACT_RAGGED_FUSE=0 "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat 4 \
    --batch 32 --runs 5 --no-one-by-one 2>&1 | tee "$OUT/bench-unfused.log"
  TRACT_RAGGED_FUSE=0 "${CLI[@]}" profile "$MODEL" "${RAGGED[@]}" --runtime cuda --widths $WIDTHS32 --runs 3 \
    >"$OUT/profile-cuda-unfused.log" 2>&1
fi

if want nocublas; then
  step bench, 112 lines, 1x1 convolutions left to tract-cuda
  TRACT_RAGGED_CUBLAS=0 "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat 4 \
    --batch 32 --runs 5 --no-one-by-one 2>&1 | tee "$OUT/bench-nocublas.log"
  TRACT_RAGGED_CUBLAS=0 "${CLI[@]}" profile "$MODEL" "${RAGGED[@]}" --runtime cuda --widths $WIDTHS32 --runs 3 \
    >"$OUT/profile-cuda-nocublas.log" 2>&1
fi

if want bench1008; then
  step bench, 1008 lines
  "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat 36 --batch 32 \
    --runs 3 ${BENCH_CPU---cpu} --no-one-by-one --save-samples /tmp/lines1008.npz 2>&1 | tee "$OUT/bench1008.log"
fi

if want torch; then
  step torch
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl && \
    PYTHONPATH=/tmp/site timeout 120 python3 .gpu-extra/torch_anchor.py "$MODEL" /tmp/lines.npz 32 2>&1 \
    | grep "^torch" | tee "$OUT/torch.log"
fi

if want python; then
  # The Python package (the wheel in .gpu-extra, release build) on ragged-cuda against the
  # Rust API on the same 112 lines: lines/s of each, and outputs against the CLI's.
  step the Python package against the Rust API, 112 lines
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl
  PYTHONPATH=/tmp/site TRACT_RAGGED_BIN=$PWD/.gpu-bundle/bin/tract-ragged NVIDIA_TF32_OVERRIDE=0 \
    timeout 300 python3 benches/python_api.py "$MODEL" fixtures/lines --runtime cuda --repeat 4 2>&1 \
    | tee "$OUT/python.log"
  # Again with glibc keeping freed memory as the CLI asks it to (mallopt in its main): the
  # part of the difference that is page faults on fresh output memory.
  step the Python package against the Rust API, glibc keeping freed memory
  MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=1073741824 \
    PYTHONPATH=/tmp/site TRACT_RAGGED_BIN=$PWD/.gpu-bundle/bin/tract-ragged NVIDIA_TF32_OVERRIDE=0 \
    timeout 300 python3 benches/python_api.py "$MODEL" fixtures/lines --runtime cuda --repeat 4 2>&1 \
    | grep -E "^(Rust|Python)" | tee -a "$OUT/python.log"
fi

if want scaling; then
  # Lines: the fixture lines repeated, one scheduled run each (after bench's warm-ups),
  # outputs reduced to their top 1 so that 112000 lines' outputs stay small. Width: one
  # random line alone, profile's entire run.
  for r in ${SCALING_REPEATS-4 40 400 4000}; do
    step scaling, ragged-cuda, $((28 * r)) lines
    runs=3; [ "$r" -ge 4000 ] && runs=1
    "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat "$r" \
      --only-scheduled --runs $runs --top-k 1 2>&1 | grep -E "samples|scheduled \(run|plans" | tee -a "$OUT/scaling.log"
  done
  for w in 50 100 200 500 1000 2000 5000; do
    step scaling, ragged-cuda, one line of $w px
    "${CLI[@]}" profile "$MODEL" "${RAGGED[@]}" --runtime cuda --widths "${w}x1" --runs 5 2>&1 \
      | grep "entire run" | sed "s/^/$w px: /" | tee -a "$OUT/scaling.log"
  done
  for r in ${SCALING_CPU_REPEATS-4 40}; do
    step scaling, CPU, $((28 * r)) lines
    "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --lines fixtures/lines --repeat "$r" --only-scheduled --runs 3 \
      --top-k 1 2>&1 | grep -E "samples|scheduled \(run|plans" | tee -a "$OUT/scaling.log"
  done
fi

if want ortcpu; then
  # The host's CPU: tract-ragged's exact scheduled run against ONNX Runtime one by one and
  # on width-sorted padded batches of 8, the 112 lines, 16 threads each, in one process
  # (benches/ort_cpu.py; the wheel in .gpu-extra).
  step the CPU against ONNX Runtime, 112 lines
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl
  PYTHONPATH=/tmp/site timeout 300 python3 benches/ort_cpu.py "$MODEL" fixtures/lines --repeat 4 \
    --threads "${ORT_THREADS:-16}" 2>&1 | tee "$OUT/ortcpu.log"
fi

if want cpurows; then
  # The speed issue's CPU rows on the host, the CLI only (no wheel): PP-OCRv4 det's 8
  # fixture pages against ONNX Runtime one page at a time, rec's 112 lines against its
  # width-sorted padded batches of 8, on every core and on 2 (`taskset -c 0,1`), on the
  # samples the CLI saved (benches/ort_saved.py). Not in the default steps: about 2 minutes.
  step the CPU rows against ONNX Runtime, det pages and rec lines
  DET=assets/ppocr/ch_PP-OCRv4_det_infer.onnx
  for cores in "" "taskset -c 0,1"; do
    threads=$(${cores:-env} nproc)
    echo "--- ${threads} cores"
    # Either model may be left behind (the carry limit): its rows are then skipped.
    [ -f "$DET" ] && $cores "${CLI[@]}" bench "$DET" --ragged x:2,3 --input-fact N,3,H,W,f32 --pages fixtures/pages \
      --repeat 1 --runs 5 --only-scheduled --save-samples /tmp/pages.npz 2>&1 | grep -E "costs|exact"
    [ -f "$DET" ] && $cores timeout 120 python3 benches/ort_saved.py "$DET" /tmp/pages.npz --threads "$threads" --runs 5
    [ -f "$MODEL" ] && $cores "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --lines fixtures/lines --repeat 4 --runs 5 \
      --only-scheduled --save-samples /tmp/lines.npz 2>&1 | grep -E "costs|exact"
    [ -f "$MODEL" ] && $cores timeout 120 python3 benches/ort_saved.py "$MODEL" /tmp/lines.npz --threads "$threads" \
      --runs 5 --padded 8
  done 2>&1 | tee "$OUT/cpurows.log"
fi

if want serve; then
  # `tract-ragged serve` on ragged-cuda under 4 client processes of 8 tritonclient HTTP
  # threads (the wheel and tritonclient's in .gpu-extra), against the offline scheduled
  # run of the same 1120 lines: whole outputs, then top 1 (what a CTC decoder reads); then
  # top 1 with --max-delay-ms 0, for one line's overhead over run_batch.
  step serve, 1120 lines
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl
  for run in "5" "5 1" "0 1"; do
    set -- $run
    PYTHONPATH=/tmp/site TRACT_RAGGED_BIN=$PWD/.gpu-bundle/bin/tract-ragged \
      timeout 200 python3 benches/serve.py "$MODEL" fixtures/lines --runtime cuda --repeat 40 \
      --processes 4 --clients 8 --max-delay-ms $1 ${2:+--top-k $2} 2>&1 | tee -a "$OUT/serve.log"
  done
fi

if want load; then
  # `tract-ragged serve` on ragged-cuda under `tract-ragged load`'s Rust clients over gRPC
  # (benches/load.sh): the 1120 lines, closed loops, then open loops; every answer checked
  # against the offline run's; LOAD_OLD's server after, the same way. LOAD_GATHERERS: one
  # load per `serve --gatherers` count, in that order (default: the server's own).
  for g in ${LOAD_GATHERERS:-default}; do
    step load, 1120 lines, gatherers $g
    gathering=""
    [ "$g" = default ] || gathering="--gatherers $g"
    OUT=$OUT/load$g RUNTIME=cuda REPEAT=40 CLIENTS="${LOAD_CLIENTS:-1 8 16 32 64 128}" \
      RATES="${LOAD_RATES-1000 2000 3000}" OLD="${LOAD_OLD:-}" SERVE_ARGS="${SERVE_ARGS:-} $gathering" \
      CLI="env NVIDIA_TF32_OVERRIDE=0 bash .gpu-bundle/run.sh bin tract-ragged" \
      timeout "${LOAD_SECONDS:-540}" bash benches/load.sh
    # One file back for the logs and metrics (a device call returns 8 files at most), the
    # samples and expected outputs left out.
    tar -C "$OUT" -czf "$OUT/load$g.tgz" --exclude='*.npz' "load$g" && rm -rf "$OUT/load$g"
  done
fi

if want gatherings; then
  # The server's gatherings without the server: the 1120 lines in calls of G, shuffled anew
  # before every run (no batch composition comes back), one call after the other, graphs
  # on then off; the first row one call of all (benches/NOTES.md "The server's gatherings
  # run offline").
  for g in all ${GATHERINGS:-112 224 448}; do
    calls=()
    [ "$g" = all ] || calls=(--calls "$g" --reshuffle)
    for graphs in 1 0; do
      step gatherings of "$g", graphs "$graphs"
      TRACT_RAGGED_GRAPHS=$graphs "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --top-k 1 \
        --lines fixtures/lines --repeat 40 --runs 9 --only-scheduled "${calls[@]}" 2>&1 \
        | grep -E "a batch:|exact" | tee -a "$OUT/gatherings.log"
    done
  done
fi

# A/B of a process-wide knob KNOB ($1) on ragged-cuda, off (new) against the default (old),
# logged to $OUT/$2.log: the server's gatherings offline (calls of 112 shuffled anew,
# graphs on), then the server at 512 clients (benches/load.sh, the default as its second
# server). About 3-4 minutes.
knob_ab() {
  local knob=$1 log=$2 value
  for value in 1 0; do
    step "gatherings of 112, $knob=$value"
    env "$knob=$value" "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --top-k 1 \
      --lines fixtures/lines --repeat 40 --runs 9 --only-scheduled --calls 112 --reshuffle 2>&1 \
      | grep -E "a batch:|exact|scheduled:" | tee -a "$OUT/$log.log"
  done
  step "the server at 512 clients, $knob off (new) and by default (old)"
  local served="env NVIDIA_TF32_OVERRIDE=0 bash .gpu-bundle/run.sh bin tract-ragged"
  OUT=$OUT/$log RUNTIME=cuda REPEAT=40 CLIENTS="512" RATES="" CLI="env $knob=0 $served" \
    OLD="$served" timeout 240 bash benches/load.sh 2>&1 | grep -v "^summary" | tee -a "$OUT/$log.log"
  rm -rf "${OUT:?}/$log"
}

if want turns; then
  # Lanes launching one at a time (the default) against at once: batches run plain cost
  # about 5 ms of host launches each (benches/NOTES.md).
  knob_ab TRACT_RAGGED_TURNS turns
fi

if want pool; then
  # Whether a lane's upload waits behind another lane's run through the memory pool
  # (benches/NOTES.md: the server's uploads took 4-5 ms, < 1 ms offline).
  knob_ab TRACT_RAGGED_POOL_WAITS pool
fi

if want fixed; then
  step fixed 256 x 48 x 320, one batch
  python3 -c "import numpy as np; r = np.random.default_rng(0); np.savez('/tmp/fixed.npz', **{f's{i:03}': r.uniform(-1, 1, (3, 48, 320)).astype(np.float32) for i in range(256)})"
  "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/fixed.npz --batch 256 --runs 5 \
    --no-one-by-one 2>&1 | tee "$OUT/fixed.log"
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl
  PYTHONPATH=/tmp/site timeout 150 python3 .gpu-extra/torch_anchor.py "$MODEL" /tmp/fixed.npz 256 2>&1 \
    | grep "^torch" | tee -a "$OUT/fixed.log"
fi

if want many; then
  step 1008 lines through tract-ragged run, against one by one
  "${CLI[@]}" run "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/lines1008.npz --out /tmp/ragged.npz --verbose 2>&1 | tail -3
  "${CLI[@]}" run "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/lines1008.npz --out /tmp/alone.npz --one-by-one
  python3 - <<'PY' 2>&1 | tee "$OUT/many.log"
import numpy as np
r, a = np.load("/tmp/ragged.npz"), np.load("/tmp/alone.npz")
assert r.files == a.files, "output names differ"
worst = max(float(np.abs(r[k] - a[k]).max()) for k in r.files)
same = sum(int((r[k].argmax(-1) == a[k].argmax(-1)).all()) for k in r.files)
print(f"{len(r.files)} outputs in order; max |ragged - one by one| {worst:.2e}; argmax identical on {same}/{len(r.files)}")
PY
fi

if want profile; then
  for rt in ${PROFILE_RUNTIMES:-cuda cpu}; do
    step profile on $rt, one batch of 32
    "${CLI[@]}" profile "$MODEL" "${RAGGED[@]}" --runtime $rt --widths $WIDTHS32 --runs 3 \
      >"$OUT/profile-$rt.log" 2>&1
    head -30 "$OUT/profile-$rt.log"
    grep -A25 "^by op" "$OUT/profile-$rt.log" | head -20
  done
fi

if want latency; then
  step latency
  for w in 320x1 320x256; do
    "${CLI[@]}" profile "$MODEL" "${RAGGED[@]}" --runtime cuda --widths $w --runs 10 2>&1 | tail -1 \
      | sed "s/^/$w: /" | tee -a "$OUT/latency.log"
  done
  # End to end (packing, upload, download, crop): one 320 px line at a time.
  python3 -c "import numpy as np; np.savez('/tmp/one.npz', s0=np.random.default_rng(1).uniform(-1, 1, (3, 48, 320)).astype(np.float32))"
  "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/one.npz --batch 1 --runs 21 \
    2>&1 | tee -a "$OUT/latency.log"
  # The same without CUDA graphs: every run launches its nodes one by one.
  echo "TRACT_RAGGED_GRAPHS=0:" | tee -a "$OUT/latency.log"
  TRACT_RAGGED_GRAPHS=0 "${CLI[@]}" bench "$MODEL" "${RAGGED[@]}" --runtime cuda --samples /tmp/one.npz --batch 1 \
    --runs 21 --no-one-by-one 2>&1 | tee -a "$OUT/latency.log"
fi

if want ceiling; then
  # The host's ceiling for the CPU runtime's lanes: the 112 lines in one process on one
  # core (one lane: every line alone), rested; then one such process per core at once;
  # then the scheduled row on every core. 16 x the one process's time over the slowest
  # of the processes at once is what the cores give this model, whatever the schedule;
  # the scheduled row against the one process is what the lanes get of it. Each process
  # runs its own copy of the bundle's launcher, which unpacks the binary it runs (one
  # shared copy would be rewritten under the running processes: "Text file busy").
  step ceiling
  CEIL=(bench "$MODEL" "${RAGGED[@]}" --runtime cpu --lines fixtures/lines --repeat 4 --only-scheduled --runs 3)
  cores=$(nproc)
  for c in $(seq 0 $((cores - 1))); do
    mkdir -p /tmp/ceiling/$c/bin && cp .gpu-bundle/run.sh /tmp/ceiling/$c/ \
      && cp .gpu-bundle/bin/tract-ragged.xz /tmp/ceiling/$c/bin/
  done
  alone() { # $1: the core
    TRACT_RAGGED_LANES=1 taskset -c "$1" timeout 300 bash /tmp/ceiling/$1/run.sh bin tract-ragged "${CEIL[@]}" 2>&1
  }
  sleep 20
  alone 0 | grep -E "exact" | sed "s/^/one process, core 0: /" | tee "$OUT/ceiling.log"
  sleep 20
  for c in $(seq 0 $((cores - 1))); do alone "$c" > /tmp/ceiling/$c.log & done
  wait
  each=$(grep -h exact /tmp/ceiling/*.log | awk '{print $(NF-2)}' | sort -n | tr '\n' ' ')
  echo "one process per core at once ($cores), ms each: $each" | tee -a "$OUT/ceiling.log"
  sleep 20
  "${CLI[@]}" "${CEIL[@]}" 2>&1 | grep -E "exact" | sed "s/^/every core: /" | tee -a "$OUT/ceiling.log"
  sleep 20
  alone 0 | grep -E "exact" | sed "s/^/one process, core 0, again: /" | tee -a "$OUT/ceiling.log"
fi

if want soak; then
  step soak, ${SOAK_BATCHES:-10000} batches from 8 threads
  SOAK_BATCHES=${SOAK_BATCHES:-10000} timeout "${SOAK_SECONDS:-540}" bash .gpu-bundle/run.sh tests soak --nocapture \
    2>&1 | grep -E "soak|test result: .* [1-9][0-9]* passed|FAILED|panicked" | tee "$OUT/soak.log"
fi

if want crnn; then
  for cell in ${CRNN_CELLS:-lstm gru}; do
    step crnn $cell
    python3 benches/crnn.py export /tmp/crnn-$cell.onnx --cell $cell
    "${CLI[@]}" bench /tmp/crnn-$cell.onnx "${RAGGED[@]}" --runtime cuda --lines fixtures/lines --repeat 4 \
      --batch 32 --runs ${CRNN_RUNS:-5} --save-samples /tmp/crnn-lines.npz 2>&1 | tee "$OUT/crnn-$cell.log"
    python3 benches/crnn.py time /tmp/crnn-lines.npz --cell $cell 2>&1 | grep "^torch" | tee -a "$OUT/crnn-$cell.log"
  done
fi

if want tractcli; then
  step "tract's CLI, -r ragged-cuda"
  xz -dc .gpu-extra/tractcli/tract.xz > /tmp/tract && chmod +x /tmp/tract
  /tmp/tract list-runtimes 2>&1 | tee "$OUT/tract-list-runtimes.txt"
  TRACT_RAGGED="bash .gpu-bundle/run.sh bin tract-ragged" \
    scripts/tract-cli-check.sh /tmp/tract ragged-cuda 2>&1 | tee "$OUT/tract-cli-check.log"
fi

if want det; then
  step det, PP-OCRv4 det on the fixture pages
  DET=assets/ppocr/ch_PP-OCRv4_det_infer.onnx
  "${CLI[@]}" bench $DET --ragged x:2,3 --input-fact N,3,H,W,f32 --runtime cuda --pages fixtures/pages \
    --repeat ${DET_REPEAT:-4} --batch 8 --runs ${DET_RUNS:-5} --save-samples /tmp/pages.npz 2>&1 | tee "$OUT/det.log"
  [ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-extra/*.whl
  PYTHONPATH=/tmp/site timeout 200 python3 benches/det_torch.py $DET /tmp/pages.npz 8 ${DET_RUNS:-5} 2>&1 \
    | grep -E "^torch|Error" | tee -a "$OUT/det.log"
fi

tar -cf "$OUT/gpu-cache.tar" .gpu-cache 2>/dev/null
echo "done $(date -u +%T)"
