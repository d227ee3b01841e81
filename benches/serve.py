"""`tract-ragged serve` under load, against the same lines run offline, in one run.

    python benches/serve.py MODEL LINES_DIR [--runtime cpu|cuda] [--repeat K] [--clients C]

Lines are the PNG images of LINES_DIR (PP-OCR rec's preprocessing: height 48, [-1, 1]),
repeated K times. Rows, each a median of 3 where it says so:
- offline: the Python package's scheduled `Model.run` on all the lines (lines/s);
- saturation: C client threads (tritonclient over HTTP, binary tensors) each sending one
  line a request, as fast as answers come (lines/s, and its ratio to offline);
- latency at offered loads of 25%, 50% and 90% of saturation (open loop, Poisson
  arrivals): p50, p90, p99 in ms;
- one line alone: a single client's request, median, against `Model.run_batch` of that
  line (the server's overhead on one line).
Needs the wheel installed (scripts/python.sh) and tritonclient[http]; the server is
TRACT_RAGGED_BIN, else the workspace's debug build.
"""

import argparse
import concurrent.futures
import os
import pathlib
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("lines")
    ap.add_argument("--runtime", default="cpu")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-delay-ms", default="5")
    args = ap.parse_args()
    lines = read_lines(args.lines, args.repeat)
    n = len(lines)
    model = tract_ragged.Model(args.model, "x:3", input_fact="N,3,48,W,f32", runtime=args.runtime)
    output = model.outputs[0]
    model.run(lines)  # plans and measured costs, as the server's first runs make them
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
    server = subprocess.Popen(
        [CLI, "serve", args.model, "--ragged", "x:3", "--input-fact", "N,3,48,W,f32",
         "--runtime", args.runtime, "--http", f"127.0.0.1:{port}",
         "--max-delay-ms", args.max_delay_ms, "--max-queue", "4096"],
        stderr=subprocess.DEVNULL,
    )
    url = f"127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpclient.InferenceServerClient(url).is_server_ready():
                    break
            except Exception:
                time.sleep(0.1)

        def saturate():
            todo = queue.Queue()
            for x in lines:
                todo.put(x)
            done = []

            def worker():
                # A client per thread: tritonclient's HTTP client is not shared across threads.
                client = httpclient.InferenceServerClient(url)
                while True:
                    try:
                        x = todo.get_nowait()
                    except queue.Empty:
                        return
                    request(client, name, x, output)
                    done.append(1)

            t = time.perf_counter()
            threads = [threading.Thread(target=worker) for _ in range(args.clients)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            elapsed = time.perf_counter() - t
            assert len(done) == n, f"{n - len(done)} requests failed"
            return elapsed

        saturate()  # the server's plans and costs
        served_lps = n / statistics.median(saturate() for _ in range(3))

        def offered(rate):
            rng = random.Random(0)
            latencies = []
            pool = concurrent.futures.ThreadPoolExecutor(64)
            local = threading.local()

            def one(x):
                if not hasattr(local, "client"):
                    local.client = httpclient.InferenceServerClient(url)
                t = time.perf_counter()
                request(local.client, name, x, output)
                latencies.append(time.perf_counter() - t)

            start = time.perf_counter()
            at = 0.0
            futures = []
            for x in lines:
                at += rng.expovariate(rate)
                delay = start + at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(one, x))
            for f in futures:
                f.result()
            pool.shutdown()
            assert len(latencies) == n
            q = np.percentile(np.array(latencies) * 1e3, [50, 90, 99])
            return q

        single = []
        client = httpclient.InferenceServerClient(url)
        for _ in range(15):
            t = time.perf_counter()
            request(client, name, lines[0], output)
            single.append(time.perf_counter() - t)

        print(f"lines: {n} ({len(lines) // args.repeat} x {args.repeat}), runtime {args.runtime}, "
              f"{args.clients} clients, max delay {args.max_delay_ms} ms")
        print(f"offline scheduled run: {offline_lps:.1f} lines/s")
        print(f"served at saturation:  {served_lps:.1f} lines/s ({served_lps / offline_lps:.0%} of offline)")
        for share in (0.25, 0.5, 0.9):
            p50, p90, p99 = offered(served_lps * share)
            print(f"offered {share:.0%} of saturation ({served_lps * share:.1f} lines/s): "
                  f"latency p50 {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms")
        s, a = statistics.median(single) * 1e3, statistics.median(alone) * 1e3
        print(f"one line alone: served {s:.2f} ms, run_batch {a:.2f} ms, overhead {s - a:.2f} ms")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
