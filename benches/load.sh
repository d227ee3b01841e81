#!/usr/bin/env bash
# `tract-ragged serve` under load from Rust clients (`tract-ragged load`: gRPC, one line a
# request, closed loops of C clients, then open loops at R requests/s), against the
# offline scheduled run of the same lines, in one invocation; every answer checked
# against the offline run's. With OLD, a second server (an older CLI) is loaded the same
# way right after, on the same lines and clients: an A/B within one machine and one call.
#
#   benches/load.sh                         # here: the release CLI, the CPU runtime
#   RUNTIME=cuda REPEAT=40 CLIENTS="8 16 32 64 128" RATES="1000 2000 3000" \
#     CLI="bash .gpu-bundle/run.sh bin tract-ragged" benches/load.sh   # the GPU machine
#
# CLI: the command running the CLI (default target/release/tract-ragged); OLD: another
# such command, for the A/B. RUNTIME: cpu or cuda. REPEAT: the fixture lines' copies (28
# lines each). CLIENTS, RATES: the loads, in that order. TOPK: outputs reduced to their
# top K (1: what a CTC decoder reads; empty: whole outputs). SERVE_ARGS: more of `serve`'s
# options (`--max-delay-ms 0`, `--plans 64`); LOAD_ARGS: more of `load`'s (`--threads 8
# --connections 8`). MODEL: another model of input x[N,3,48,W] (a trivial one shows what
# the requests cost around the model). CLIENT: the command running the load clients
# (default: CLI; e.g. under `taskset` on cores of their own). Logs and the summary land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/load-out}
mkdir -p "$OUT"
CLI=${CLI:-target/release/tract-ragged}
CLIENT=${CLIENT:-$CLI}
OLD=${OLD:-}
RUNTIME=${RUNTIME:-cpu}
REPEAT=${REPEAT:-4}
CLIENTS=${CLIENTS:-1 4 16 64}
RATES=${RATES:-}
TOPK=${TOPK-1}
SERVE_ARGS=${SERVE_ARGS:-}
# OLD's server's own options, for an A/B of options on one CLI (default: SERVE_ARGS).
OLD_SERVE_ARGS=${OLD_SERVE_ARGS-$SERVE_ARGS}
LOAD_ARGS=${LOAD_ARGS:-}
MODEL=${MODEL:-assets/ppocr/ch_PP-OCRv4_rec_infer.onnx}
NAME=$(basename "$MODEL" .onnx)
RAGGED=(--ragged x:3 --input-fact N,3,48,W,f32 --runtime "$RUNTIME" ${TOPK:+--top-k $TOPK})
LINES=$OUT/lines.npz
EXPECT=$OUT/expected.npz
summary=$OUT/load-summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# The offline scheduled run, its samples saved, and their answers as `run` gives them.
$CLI bench "$MODEL" "${RAGGED[@]}" --lines fixtures/lines --repeat "$REPEAT" --only-scheduled \
  --runs 5 --save-samples "$LINES" >"$OUT/offline.log" 2>&1 || { tail "$OUT/offline.log"; exit 1; }
offline=$(awk '/scheduled \(run/ { print $(NF-1) }' "$OUT/offline.log")
$CLI run "$MODEL" "${RAGGED[@]}" --samples "$LINES" --out "$EXPECT" >"$OUT/expected.log" 2>&1 \
  || { tail "$OUT/expected.log"; exit 1; }
say "$(date -u +%F) $(git rev-parse --short HEAD 2>/dev/null) runtime $RUNTIME, $((28 * REPEAT)) lines, top ${TOPK:-all}; offline scheduled: $offline lines/s"
say "$(grep -E 'ragged plans' "$OUT/offline.log")"
say "offline: $(grep -oE 'a batch:.*' "$OUT/offline.log")"
say "$(grep -E 'fixed part' "$OUT/offline.log")"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Loads the server `$1` (a CLI command) labelled `$2`, with `serve`'s options `$3`.
load_server() {
  local cli=$1 label=$2 args=$3 http grpc pid
  http=$(free_port)
  grpc=$(free_port)
  # Word splitting of $cli is wanted: it may be `bash .gpu-bundle/run.sh bin tract-ragged`.
  # shellcheck disable=SC2086
  $cli serve "$MODEL" "${RAGGED[@]}" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" \
    --max-queue 4096 $args >"$OUT/serve-$label.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do
    curl -sf "127.0.0.1:$http/v2/health/ready" >/dev/null && break
    sleep 0.2
  done
  local metrics=$OUT/metrics-$label.txt
  plans() { curl -s "127.0.0.1:$http/metrics" | awk '/^tract_ragged_prepared_plans / { print $2 }'; }
  # The server's side of one load (its warm-up round included), from its metrics before
  # and after: where a request's time went (waiting for its gathered run, the rest) and
  # what the runs were.
  local m0=$OUT/metrics-$label-before.txt m1=$OUT/metrics-$label-after.txt
  server_side() {
    curl -s "127.0.0.1:$http/metrics" >"$m1"
    awk 'FNR == 1 { f++ }
      /^tract_ragged_request_seconds_(sum|count)\{outcome="ok"\}/ || /^tract_ragged_request_wait_seconds_(sum|count) / || /^tract_ragged_run_(seconds|samples)_(sum|count) / || /^tract_ragged_(batch|padding)_cells_total / {
        k = $1; sub(/\{.*/, "", k); v[k] += (f == 1 ? -$2 : $2) }
      /^tract_ragged_phase(s|_seconds)_total\{phase="(check|schedule|upload|pack|turn|run|download|crop|hold)"\}/ { v[$1] += (f == 1 ? -$2 : $2) }
      /^tract_ragged_batch_overhead_cells / { overhead = $2 }
      /^tract_ragged_runtime_events_total\{/ { v[$1] += (f == 1 ? -$2 : $2) }
      END {
        q = v["tract_ragged_request_seconds_count"]; r = v["tract_ragged_run_seconds_count"]
        if (q == 0 || r == 0) { print "server: nothing answered"; exit }
        printf "server: %.1f ms a request, %.1f of it waiting for its run; %d runs of %.1f lines, %.1f ms each; %.0f%% of batch cells padding",
          1000 * v["tract_ragged_request_seconds_sum"] / q, 1000 * v["tract_ragged_request_wait_seconds_sum"] / q,
          r, v["tract_ragged_run_samples_sum"] / r, 1000 * v["tract_ragged_run_seconds_sum"] / r,
          100 * v["tract_ragged_padding_cells_total"] / (v["tract_ragged_batch_cells_total"] + 1e-9)
        # Checking the samples and cutting them into batches: once a gathered run.
        printf "; a run: check %.2f ms, schedule %.2f ms",
          1000 * v["tract_ragged_phase_seconds_total{phase=\"check\"}"] / r,
          1000 * v["tract_ragged_phase_seconds_total{phase=\"schedule\"}"] / r
        if (overhead > 0) printf "; a batch'"'"'s fixed part %d cells", overhead
        printf "; a batch:"
        split("upload turn run download", ps, " ")
        for (i = 1; i <= 4; i++) {
          n = v["tract_ragged_phases_total{phase=\"" ps[i] "\"}"]
          if (n > 0) printf " %s %.2f ms", ps[i], 1000 * v["tract_ragged_phase_seconds_total{phase=\"" ps[i] "\"}"] / n
          # Packing the samples within an upload, cropping them within a download, per batch.
          sub_phase = ps[i] == "upload" ? "pack" : ps[i] == "download" ? "crop" : ""
          if (n > 0 && sub_phase != "") printf " (%s %.2f)", sub_phase, 1000 * v["tract_ragged_phase_seconds_total{phase=\"" sub_phase "\"}"] / n
        }
        # Waiting behind a graph capture, within the phases above, per batch.
        n = v["tract_ragged_phases_total{phase=\"run\"}"]
        if (n > 0) printf " (hold %.2f ms)", 1000 * v["tract_ragged_phase_seconds_total{phase=\"hold\"}"] / n
        e = "tract_ragged_runtime_events_total{event=\""
        if (v[e "plain_run\"}"] + v[e "graph_replay\"}"] > 0)
          printf "; %d plain runs, %d graph replays, %d captures (%d failed, %d deferred), %d evictions, %d plan states, %d conv descriptors",
            v[e "plain_run\"}"], v[e "graph_replay\"}"], v[e "graph_capture\"}"], v[e "graph_capture_failed\"}"], v[e "graph_capture_deferred\"}"], v[e "graph_eviction\"}"],
            v[e "plan_state\"}"], v[e "conv_descriptors\"}"] }' "$m0" "$m1"
    mv "$m1" "$m0"
  }
  curl -s "127.0.0.1:$http/metrics" >"$m0"
  for c in $CLIENTS; do
    local before log=$OUT/load-$label-c$c.log
    before=$(plans)
    $CLIENT load "127.0.0.1:$grpc" --model "$NAME" --samples "$LINES" --expect "$EXPECT" \
      --tolerance 1e-3 --concurrency "$c" --rounds 2 $LOAD_ARGS >"$log" 2>&1
    say "$label $c clients: $(awk '/^answered/ { print $(NF-1), "lines/s" }' "$log"), $(grep -E '^latency' "$log" | cut -d' ' -f3-), $(grep -oE '[0-9]+ of [0-9]+ answers within [0-9.e-]+' "$log"), $(( $(plans) - before )) plans prepared"
    say "  $(server_side)"
  done
  for r in $RATES; do
    local before log=$OUT/load-$label-r$r.log
    before=$(plans)
    $CLIENT load "127.0.0.1:$grpc" --model "$NAME" --samples "$LINES" --expect "$EXPECT" \
      --tolerance 1e-3 --rate "$r" --rounds 2 $LOAD_ARGS >"$log" 2>&1
    say "$label $r requests/s: $(awk '/^answered/ { print $(NF-1), "lines/s" }' "$log"), $(grep -E '^latency' "$log" | cut -d' ' -f3-), $(( $(plans) - before )) plans prepared"
    say "  $(server_side)"
  done
  curl -s "127.0.0.1:$http/metrics" >"$metrics"
  say "$label: $(awk '/^tract_ragged_run_samples_count / { r = $2 } /^tract_ragged_run_samples_sum / { s = $2 } /^tract_ragged_batch_samples_count / { b = $2 } /^tract_ragged_prepared_plans / { p = $2 } END { printf "%d gathered runs of %.1f lines, %d batches, %d plans prepared", r, s / r, b, p }' "$metrics")"
  grep -h -E "answers wrong|requests failed" "$OUT"/load-"$label"-*.log | sort | uniq -c | sed "s/^/$label: /" | tee -a "$summary"
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"
}

load_server "$CLI" new "$SERVE_ARGS"
[ -n "$OLD" ] && load_server "$OLD" old "$OLD_SERVE_ARGS"
echo "summary: $summary"
