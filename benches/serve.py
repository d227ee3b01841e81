"""`tract-ragged serve` under load, against the same lines run offline, in one run.

    python benches/serve.py MODEL LINES_DIR [--runtime cpu|cuda] [--repeat K]
        [--processes P] [--clients C] [--top-k K] [--max-delay-ms D]

Lines are the PNG images of LINES_DIR (PP-OCR rec's preprocessing: height 48, [-1, 1]),
repeated K times. Clients are P processes of C threads each (tritonclient over HTTP,
binary tensors, one client per thread): a GPU answers faster than one Python process can
send and decode requests. Rows, each a median of 3 where it says so:
- offline: the Python package's scheduled `Model.run` on all the lines (lines/s);
- saturation: every client thread sending one line a request, as fast as answers come
  (lines/s, and its ratio to offline);
- latency at offered loads of 25%, 50% and 90% of saturation (open loop, Poisson
  arrivals spread over the processes): p50, p90, p99 in ms;
- one line alone: a single client's request, median, against `Model.run_batch` of that
  line (the server's overhead on one line); and from the server's metrics, the mean time
  from its request read to its answer and of that, its gathering's run: what the server
  adds apart from the client and HTTP.
`--top-k K` serves (and runs offline) the model with its outputs reduced to their top K
on the device, as a recogniser's CTC decoder reads them, rather than whole probabilities.
Needs the wheel installed (scripts/python.sh) and tritonclient[http]; the server is
TRACT_RAGGED_BIN, else the workspace's debug build.
"""

import argparse
import concurrent.futures
import multiprocessing
import os
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import tritonclient.http as httpclient

import tract_ragged
from lines import lines as read_lines

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = os.environ.get("TRACT_RAGGED_BIN", str(ROOT / "target" / "debug" / "tract-ragged"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(client, name, x, output):
    inp = httpclient.InferInput("x", [1, *x.shape], "FP32")
    inp.set_data_from_numpy(x[None])
    return client.infer(name, [inp], outputs=[httpclient.InferRequestedOutput(output)])


def clients(job):
    """One client process's share of a load: its lines (every `parts`-th from `part`),
    sent from `threads` threads from `start_at` (the host's clock) on, as fast as answers
    come (`rate` None) or at Poisson arrivals of `rate` a second. Its latencies in
    seconds, and when its last answer came."""
    url, name, output, folder, repeat, part, parts, threads, rate, start_at = job
    lines = read_lines(folder, repeat)[part::parts]
    local = threading.local()
    latencies = []

    def one(x):
        if not hasattr(local, "client"):
            # tritonclient's HTTP client is not shared across threads.
            local.client = httpclient.InferenceServerClient(url)
        t = time.perf_counter()
        request(local.client, name, x, output)
        latencies.append(time.perf_counter() - t)

    time.sleep(max(0.0, start_at - time.time()))
    if rate is None:
        todo = iter(lines)
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    x = next(todo, None)
                if x is None:
                    return
                one(x)

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    else:
        rng = random.Random(part)
        pool = concurrent.futures.ThreadPoolExecutor(threads)
        start, at, futures = time.perf_counter(), 0.0, []
        for x in lines:
            at += rng.expovariate(rate)
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, x))
        for f in futures:
            f.result()
        pool.shutdown()
    assert len(latencies) == len(lines), f"{len(lines) - len(latencies)} requests failed"
    return latencies, time.time()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("lines")
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--clients", type=int, default=16, help="threads per process")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--max-delay-ms", default="5")
    ap.add_argument("--plans", default="32", help="the server's --plans")
    args = ap.parse_args()
    lines = read_lines(args.lines, args.repeat)
    n = len(lines)
    model = tract_ragged.Model(args.model, "x:3", input_fact="N,3,48,W,f32", runtime=args.runtime,
                               top_k=args.top_k)
    output = model.outputs[0]
    # Plans and measured costs, as the server's first runs make them; on a device each
    # lane captures its graphs on a batch shape's second run (as `tract-ragged bench`).
    for _ in range(8 if args.runtime != "cpu" else 1):
        model.run(lines)
    offline = []
    for _ in range(3):
        t = time.perf_counter()
        model.run(lines)
        offline.append(time.perf_counter() - t)
    offline_lps = n / statistics.median(offline)
    alone = []
    for _ in range(15):
        t = time.perf_counter()
        model.run_batch([lines[0]])
        alone.append(time.perf_counter() - t)
    del model

    port = free_port()
    name = pathlib.Path(args.model).stem
    top_k = ["--top-k", str(args.top_k)] if args.top_k else []
    server = subprocess.Popen(
        [CLI, "serve", args.model, "--ragged", "x:3", "--input-fact", "N,3,48,W,f32",
         "--runtime", args.runtime, "--http", f"127.0.0.1:{port}",
         "--max-delay-ms", args.max_delay_ms, "--max-queue", "4096", "--plans", args.plans,
         *top_k],
        stderr=subprocess.DEVNULL,
    )
    url = f"127.0.0.1:{port}"
    processes = concurrent.futures.ProcessPoolExecutor(
        args.processes, mp_context=multiprocessing.get_context("spawn"))
    try:
        for _ in range(600):
            try:
                if httpclient.InferenceServerClient(url).is_server_ready():
                    break
            except Exception:
                time.sleep(0.1)

        def load(rate, threads):
            """Every line sent once by the client processes: latencies (ms) and lines/s."""
            start_at = time.time() + 2.0  # once every process has read its lines
            share = None if rate is None else rate / args.processes
            jobs = [(url, name, output, args.lines, args.repeat, part, args.processes, threads,
                     share, start_at) for part in range(args.processes)]
            done = list(processes.map(clients, jobs))
            latencies = [l for part, _ in done for l in part]
            assert len(latencies) == n, f"{n - len(latencies)} lines lost"
            return np.array(latencies) * 1e3, n / (max(end for _, end in done) - start_at)

        load(None, args.clients)  # the server's plans and costs
        served_lps = statistics.median(load(None, args.clients)[1] for _ in range(3))

        def metrics():
            with urllib.request.urlopen(f"http://{url}/metrics") as r:
                return dict(l.rsplit(" ", 1) for l in r.read().decode().splitlines()
                            if l and not l.startswith("#"))

        single = []
        client = httpclient.InferenceServerClient(url)
        request(client, name, lines[0], output)
        before = metrics()
        for _ in range(15):
            t = time.perf_counter()
            request(client, name, lines[0], output)
            single.append(time.perf_counter() - t)
        after = metrics()

        def mean_ms(metric, labels=""):
            # A histogram's mean over the single requests, from its sum and count.
            d = lambda k: float(after.get(k, 0)) - float(before.get(k, 0))
            return d(f"{metric}_sum{labels}") / max(d(f"{metric}_count{labels}"), 1.0) * 1e3

        # Where a lone line's time goes: in the server from its request read to its answer,
        # and of that, the gathering's run.
        in_server = mean_ms("tract_ragged_request_seconds", '{outcome="ok"}')
        its_run = mean_ms("tract_ragged_run_seconds")

        print(f"lines: {n} ({n // args.repeat} x {args.repeat}), runtime {args.runtime}, "
              f"{args.processes} client processes of {args.clients} threads, max delay "
              f"{args.max_delay_ms} ms, {args.plans} plans"
              + (f", top {args.top_k}" if args.top_k else ", whole outputs"))
        print(f"offline scheduled run: {offline_lps:.1f} lines/s")
        print(f"served at saturation:  {served_lps:.1f} lines/s ({served_lps / offline_lps:.0%} of offline)")
        for share in (0.25, 0.5, 0.9):
            latencies, _ = load(served_lps * share, 32)
            p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
            print(f"offered {share:.0%} of saturation ({served_lps * share:.1f} lines/s): "
                  f"latency p50 {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms")
        s, a = statistics.median(single) * 1e3, statistics.median(alone) * 1e3
        print(f"one line alone: served {s:.2f} ms, run_batch {a:.2f} ms, overhead {s - a:.2f} ms; "
              f"in the server {in_server:.2f} ms (means), its run {its_run:.2f} ms: the server's "
              f"own {in_server - its_run:.2f} ms, the client and HTTP {s - in_server:.2f} ms")
        final = metrics()
        print(f"server: {float(final['tract_ragged_run_samples_count']):.0f} gathered runs, "
              f"{float(final['tract_ragged_batch_samples_count']):.0f} batches, "
              f"{float(final['tract_ragged_prepared_plans']):.0f} plans prepared")
    finally:
        processes.shutdown()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
