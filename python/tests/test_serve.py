"""`tract-ragged serve` with a real client: Triton's `tritonclient` over HTTP (JSON and
binary tensors) and gRPC, against the server started here on loopback. Every answer is checked
against its samples run alone (the Python package's reference); malformed and hostile
requests get 400 while the server goes on; a full queue gets 429; SIGTERM finishes the
requests in flight and exits 0.

Run by scripts/python.sh (part of scripts/test.sh); the server is TRACT_RAGGED_BIN, else
the workspace's debug build.
"""

import concurrent.futures
import contextlib
import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tract_ragged

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = ROOT / "fixtures" / "zoo" / "tv_mobilenet_v3.onnx"
STATEFUL = ROOT / "fixtures" / "encoders" / "stateful" / "model.onnx"
CLI = os.environ.get("TRACT_RAGGED_BIN", str(ROOT / "target" / "debug" / "tract-ragged"))
FACT = "N,3,64,W,f32"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(model, ragged, fact, *extra):
    """A server on free loopback ports (HTTP, gRPC), ready; stopped (SIGTERM) on the way
    out. Yields the HTTP address, the process and the gRPC address."""
    port, gport = free_port(), free_port()
    proc = subprocess.Popen(
        [CLI, "serve", str(model), "--ragged", ragged, "--input-fact", fact,
         "--http", f"127.0.0.1:{port}", "--grpc", f"127.0.0.1:{gport}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"127.0.0.1:{port}"
    try:
        client = httpclient.InferenceServerClient(url)
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {proc.stderr.read()}")
            try:
                if client.is_server_ready():
                    break
            except Exception:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("the server did not become ready in 60 s")
        yield url, proc, f"127.0.0.1:{gport}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def image_server():
    with serving(IMAGE, "x:3", FACT, "--max-delay-ms", "20", "--io-threads", "3") as s:
        yield s


@pytest.fixture(scope="module")
def reference():
    return tract_ragged.Model(IMAGE, "x:3", input_fact=FACT)


def request_of(samples, binary=True, outputs=None):
    x = httpclient.InferInput("x", list(samples.shape), "FP32")
    x.set_data_from_numpy(samples, binary_data=binary)
    wanted = None
    if outputs is not None:
        wanted = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
    return [x], wanted


def alone(reference, samples):
    """Each sample alone, stacked as the server answers: one array per output."""
    each = reference.run_one_by_one(list(samples))
    return [np.stack([outs[k] for outs in each]) for k in range(len(each[0]))]


def test_health_and_metadata(image_server, reference):
    url, _, _ = image_server
    client = httpclient.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tv_mobilenet_v3")
    assert not client.is_model_ready("another")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("tv_mobilenet_v3")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 64, -1]}]
    assert [o["name"] for o in meta["outputs"]] == reference.outputs
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("another")


def test_infer_binary_and_json_give_each_sample_its_own_answer(image_server, reference):
    url, _, _ = image_server
    client = httpclient.InferenceServerClient(url)
    out = reference.outputs[0]
    samples = np.random.default_rng(1).uniform(-1, 1, (2, 3, 64, 50)).astype(np.float32)
    expected = alone(reference, samples)
    inputs, outputs = request_of(samples)
    binary = client.infer("tv_mobilenet_v3", inputs, outputs=outputs).as_numpy(out)
    inputs, outputs = request_of(samples, binary=False, outputs=[out])
    as_json = client.infer("tv_mobilenet_v3", inputs, outputs=outputs).as_numpy(out)
    assert binary.shape == expected[0].shape and binary.dtype == np.float32
    assert np.abs(binary - expected[0]).max() <= 1e-5
    # The same request alone twice: the same batch, the same bits, whatever the encoding.
    assert np.array_equal(binary, as_json)


def test_sixteen_clients_of_random_widths_each_get_their_samples_alone(image_server, reference):
    url, _, _ = image_server
    out = reference.outputs[0]
    rng = np.random.default_rng(7)
    requests = [
        rng.uniform(-1, 1, (int(rng.integers(1, 4)), 3, 64, int(rng.integers(33, 140))))
        .astype(np.float32)
        for _ in range(64)
    ]

    def send(k):
        client = httpclient.InferenceServerClient(url)
        inputs, outputs = request_of(requests[k])
        return client.infer("tv_mobilenet_v3", inputs, outputs=outputs).as_numpy(out)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, range(len(requests))))
    assert len(answers) == len(requests)
    for samples, answer in zip(requests, answers):
        expected = alone(reference, samples)[0]
        assert answer.shape == expected.shape
        assert np.abs(answer - expected).max() <= 1e-5


def scrape(url):
    """The server's metrics: each sample's value by its name and labels."""
    conn = http.client.HTTPConnection(url, timeout=60)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    assert response.status == 200
    text = response.read().decode()
    conn.close()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads listed by Linux's /proc")
def test_the_request_path_runs_on_the_threads_asked(image_server):
    # `--io-threads 3`: tokio's workers, named by tokio, are three.
    _, proc, _ = image_server
    names = [open(f"/proc/{proc.pid}/task/{t}/comm").read().strip()
             for t in os.listdir(f"/proc/{proc.pid}/task")]
    assert names.count("tokio-rt-worker") == 3, names


def test_metrics_count_what_the_clients_saw(image_server):
    # After the tests above on this server: 64 concurrent requests and a few single ones.
    url, _, _ = image_server
    m = scrape(url)
    ok = m['tract_ragged_requests_total{outcome="ok"}']
    runs = m["tract_ragged_run_samples_count"]
    assert ok >= 64 and m["tract_ragged_queue_depth"] == 0
    assert m["tract_ragged_requests_in_flight"] == 0
    # Concurrent requests were gathered: fewer runs than requests.
    assert 0 < runs < ok, (runs, ok)
    assert m["tract_ragged_run_samples_sum"] >= ok
    assert 0 <= m["tract_ragged_padding_cells_total"] < m["tract_ragged_batch_cells_total"]
    assert m["tract_ragged_memory_budget_bytes"] > 0
    # At least a plan per gathered run's first batch shape; never more than batches.
    assert 1 <= m["tract_ragged_prepared_plans"] <= m["tract_ragged_batch_samples_count"]
    # The fitted fixed part of a batch: 0 on the CPU runtime, whose cut prices batches
    # by their measured costs instead.
    assert m["tract_ragged_batch_overhead_cells"] == 0
    assert m['tract_ragged_request_seconds_count{outcome="ok"}'] == ok
    # Every request that ran waited once (those refused in their run too), and no
    # longer than requests took in all.
    answered = sum(v for k, v in m.items() if k.startswith("tract_ragged_requests_total{"))
    took = sum(v for k, v in m.items() if k.startswith("tract_ragged_request_seconds_sum{"))
    assert ok <= m["tract_ragged_request_wait_seconds_count"] <= answered
    assert 0 < m["tract_ragged_request_wait_seconds_sum"] <= took
    # Every batch planned was uploaded, run and downloaded (once, or more where split).
    batches = m["tract_ragged_batch_samples_count"]
    for phase in ["upload", "run", "download"]:
        assert m[f'tract_ragged_phases_total{{phase="{phase}"}}'] >= batches, phase
        assert m[f'tract_ragged_phase_seconds_total{{phase="{phase}"}}'] > 0, phase
    # The runtime's events are exported (the CPU runtime counts none of them).
    events = ["graph_capture", "graph_replay", "graph_eviction", "plain_run"]
    for event in events + ["plan_state", "conv_descriptors"]:
        assert m[f'tract_ragged_runtime_events_total{{event="{event}"}}'] >= 0, event


def test_several_inputs_and_a_shared_one():
    model = tract_ragged.Model(STATEFUL, "x:1", input_fact="N,T,4,f32")
    rng = np.random.default_rng(3)
    gain = np.array(1.5, np.float32)
    with serving(STATEFUL, "x:1", "N,T,4,f32") as (url, _, _):
        client = httpclient.InferenceServerClient(url)
        for n, t in [(1, 3), (3, 8), (2, 20)]:
            x = rng.uniform(-1, 1, (n, t, 4)).astype(np.float32)
            state = rng.uniform(-1, 1, (n, 8)).astype(np.float32)
            inputs = []
            for name, value in [("x", x), ("state", state), ("gain", gain)]:
                i = httpclient.InferInput(name, list(value.shape), "FP32")
                i.set_data_from_numpy(value)
                inputs.append(i)
            result = client.infer("model", inputs)
            each = model.run_one_by_one(
                [{"x": x[k], "state": state[k]} for k in range(n)], {"gain": gain}
            )
            for j, name in enumerate(model.outputs):
                expected = np.stack([outs[j] for outs in each])
                got = result.as_numpy(name)
                assert got.shape == expected.shape
                assert np.abs(got - expected).max() <= 1e-5


def post(url, body, headers=None, path="/v2/models/tv_mobilenet_v3/infer"):
    conn = http.client.HTTPConnection(url, timeout=60)
    conn.request("POST", path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def binary_request(x, header=None, extra=b"", size=None):
    header = header or {
        "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": size if size is not None else x.nbytes}}],
    }
    head = json.dumps(header).encode()
    return head + x.tobytes() + extra, {"Inference-Header-Content-Length": str(len(head))}


def test_malformed_and_hostile_requests_get_400_and_the_server_goes_on(image_server):
    url, proc, _ = image_server
    x = np.zeros((1, 3, 64, 40), np.float32)
    flat = x.ravel().tolist()
    bad_json = [
        b"{",
        b"[]",
        b'{"inputs": 3}',
        json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 64, 40], "datatype": "FP64",
                                "data": flat}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [1, 2, 64, 60], "datatype": "FP32",
                                "data": flat}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [3, 64, 40], "datatype": "FP32",
                                "data": flat}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 64, 41], "datatype": "FP32",
                                "data": flat}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 64, -40], "datatype": "FP32",
                                "data": flat}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [2**62, 2**62, 64, 40],
                                "datatype": "FP32", "data": flat}]}).encode(),
        json.dumps({"inputs": [{"name": "y", "shape": [1, 3, 64, 40], "datatype": "FP32",
                                "data": flat}]}).encode(),
        json.dumps({"inputs": []}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [0, 3, 64, 40], "datatype": "FP32",
                                "data": []}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 64, 40], "datatype": "FP32",
                                "data": flat}], "outputs": [{"name": "nope"}]}).encode(),
        json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 64, 40], "datatype": "FP32",
                                "data": flat}], "parameters": {"timeout": "soon"}}).encode(),
    ]
    for body in bad_json:
        status, data = post(url, body)
        assert status == 400, (body[:80], status, data)
        assert json.loads(data)["error"], data
    hostile = [
        binary_request(x, size=x.nbytes + 4),  # declares more than the body has
        binary_request(x, size=x.nbytes - 4),  # declares less: bytes left over
        binary_request(x, extra=b"\0" * 8),  # trailing bytes
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "100000"}),  # header past body
        (b"{}", {"Inference-Header-Content-Length": "-3"}),
        binary_request(x, size=2**63),
    ]
    truncated, headers = binary_request(x)
    hostile.append((truncated[:-100], headers))
    for body, headers in hostile:
        status, data = post(url, body, headers)
        assert status == 400, (headers, status, data)
    status, _ = post(url, b"{}", path="/v2/models/another/infer")
    assert status == 404
    assert proc.poll() is None
    body, headers = binary_request(x)
    assert post(url, body, headers)[0] == 200


def test_a_deadline_passed_is_504_and_a_body_too_large_413():
    with serving(IMAGE, "x:3", FACT, "--max-delay-ms", "50", "--max-body", "1M") as (url, _, _):
        big = np.zeros((1, 3, 64, 2000), np.float32)
        assert post(url, *binary_request(big))[0] == 413
        x = np.zeros((1, 3, 64, 40), np.float32)
        header = {"inputs": [{"name": "x", "shape": [1, 3, 64, 40], "datatype": "FP32",
                              "parameters": {"binary_data_size": x.nbytes}}],
                  "parameters": {"timeout": 1}}
        status, data = post(url, *binary_request(x, header=header))
        assert status == 504, data


def test_a_full_queue_is_429_and_no_request_is_lost():
    # One request a run and one waiting: while a long run goes, the others are refused.
    with serving(IMAGE, "x:3", FACT, "--max-queue", "1", "--max-gather", "1") as (url, _, _):
        slow = np.zeros((96, 3, 64, 1200), np.float32)  # about 1 s on 2 cores
        quick = np.zeros((1, 3, 64, 40), np.float32)
        statuses = []

        def send(x):
            status, _ = post(url, *binary_request(x))
            statuses.append(status)

        first = threading.Thread(target=send, args=(slow,))
        first.start()
        time.sleep(0.2)
        others = [threading.Thread(target=send, args=(quick,)) for _ in range(6)]
        for t in others:
            t.start()
        for t in [first, *others]:
            t.join()
        assert len(statuses) == 7
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses


def test_sigterm_finishes_the_requests_in_flight_and_exits_0():
    with serving(IMAGE, "x:3", FACT) as (url, proc, _):
        x = np.zeros((64, 3, 64, 1000), np.float32)  # gathered: about 2 s on 2 cores
        results = []

        def send():
            results.append(post(url, *binary_request(x))[0])

        threads = [threading.Thread(target=send) for _ in range(3)]
        for t in threads:
            t.start()
        # SIGTERM once the server holds all three (their 49 MB bodies read): a request
        # still being sent then would rightly be refused as unavailable.
        for _ in range(600):
            if scrape(url)["tract_ragged_requests_in_flight"] == 3:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join()
        assert proc.wait(timeout=60) == 0
        assert results == [200, 200, 200], results


def grpc_inputs(samples):
    x = grpcclient.InferInput("x", list(samples.shape), "FP32")
    x.set_data_from_numpy(samples)
    return [x]


def test_grpc_health_metadata_and_infer_as_over_http(image_server, reference):
    url, _, gurl = image_server
    client = grpcclient.InferenceServerClient(gurl)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tv_mobilenet_v3")
    meta = client.get_model_metadata("tv_mobilenet_v3", as_json=True)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "3", "64", "-1"]}]
    assert "binary_tensor_data" in client.get_server_metadata(as_json=True)["extensions"]
    out = reference.outputs[0]
    samples = np.random.default_rng(5).uniform(-1, 1, (3, 3, 64, 77)).astype(np.float32)
    got = client.infer("tv_mobilenet_v3", grpc_inputs(samples)).as_numpy(out)
    expected = alone(reference, samples)[0]
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-5
    inputs, outputs = request_of(samples)
    over_http = httpclient.InferenceServerClient(url).infer(
        "tv_mobilenet_v3", inputs, outputs=outputs).as_numpy(out)
    assert np.array_equal(got, over_http)


def test_grpc_clients_of_random_widths_and_errors(image_server, reference):
    _, proc, gurl = image_server
    out = reference.outputs[0]
    rng = np.random.default_rng(11)
    requests = [
        rng.uniform(-1, 1, (int(rng.integers(1, 3)), 3, 64, int(rng.integers(33, 120))))
        .astype(np.float32)
        for _ in range(24)
    ]

    def send(k):
        client = grpcclient.InferenceServerClient(gurl)
        return client.infer("tv_mobilenet_v3", grpc_inputs(requests[k])).as_numpy(out)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(len(requests))))
    for samples, answer in zip(requests, answers):
        assert np.abs(answer - alone(reference, samples)[0]).max() <= 1e-5
    client = grpcclient.InferenceServerClient(gurl)
    wrong = grpcclient.InferInput("x", [1, 3, 64, 40], "FP64")
    wrong.set_data_from_numpy(np.zeros((1, 3, 64, 40), np.float64))
    with pytest.raises(InferenceServerException) as e:
        client.infer("tv_mobilenet_v3", [wrong])
    assert "INVALID_ARGUMENT" in str(e.value.status()) and "FP64" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("another", grpc_inputs(requests[0]))
    assert "NOT_FOUND" in str(e.value.status())
    assert proc.poll() is None


def test_grpc_malformed_requests_are_invalid_argument_and_the_server_goes_on(image_server):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    _, proc, gurl = image_server
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(gurl))
    x = np.zeros((1, 3, 64, 40), np.float32)

    def request(shape=(1, 3, 64, 40), datatype="FP32", raw=(x.tobytes(),), contents=None):
        r = service_pb2.ModelInferRequest(model_name="tv_mobilenet_v3")
        t = r.inputs.add(name="x", datatype=datatype, shape=list(shape))
        if contents is not None:
            t.contents.fp32_contents.extend(contents)
        r.raw_input_contents.extend(raw)
        return r

    bad = [
        request(raw=(x.tobytes(), x.tobytes())),  # two raw contents for one input
        request(raw=(x.tobytes()[:-4],)),  # truncated
        request(raw=(x.tobytes() + b"\0" * 4,)),  # too long
        request(raw=(), contents=[0.0] * 10),  # too few typed values
        request(raw=(x.tobytes(),), contents=[0.0]),  # both
        request(datatype="FP16", raw=(), contents=[0.0]),  # no typed contents for FP16
        request(shape=(2**62, 2**62, 64, 40)),
        request(shape=(1, 3, 64, -40)),
        request(shape=(1, 2, 64, 60)),  # wrong channels, bytes matching
    ]
    for r in bad:
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(r, timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.value.code(), e.value.details())
        assert e.value.details()
    # Typed contents of the right count run, as raw bytes do.
    typed = stub.ModelInfer(request(raw=(), contents=[0.0] * x.size), timeout=60)
    raw = stub.ModelInfer(request(), timeout=60)
    assert typed.raw_output_contents == raw.raw_output_contents
    assert proc.poll() is None


def test_the_load_tool_sees_every_answer_equal_to_its_sample_alone(image_server, reference, tmp_path):
    """`tract-ragged load` (closed loop, then open loop) against the server: every answer
    checked against the sample alone; an archive that says otherwise fails the command."""
    _, proc, gurl = image_server
    rng = np.random.default_rng(13)
    samples = [rng.uniform(-1, 1, (3, 64, int(rng.integers(33, 120)))).astype(np.float32)
               for _ in range(12)]
    np.savez(tmp_path / "in.npz", **{f"s{i:04}": x for i, x in enumerate(samples)})
    expected = {f"s{i}_o{j}": o for i, outs in enumerate(reference.run_one_by_one(samples))
                for j, o in enumerate(outs)}
    np.savez(tmp_path / "alone.npz", **expected)

    def load(*extra):
        return subprocess.run(
            [CLI, "load", gurl, "--model", "tv_mobilenet_v3", "--samples", str(tmp_path / "in.npz"),
             "--tolerance", "1e-5", *extra],
            capture_output=True, text=True, timeout=300)

    closed = load("--expect", str(tmp_path / "alone.npz"), "--rounds", "3", "--concurrency", "8")
    assert closed.returncode == 0, closed.stderr
    assert "answered 36 of 36 requests" in closed.stdout
    assert "36 of 36 answers within" in closed.stdout
    opened = load("--expect", str(tmp_path / "alone.npz"), "--rate", "100", "--warmup", "0")
    assert opened.returncode == 0, opened.stderr
    assert "answered 12 of 12 requests" in opened.stdout and "p99" in opened.stdout
    expected["s5_o0"] = expected["s5_o0"] + 1e-3
    np.savez(tmp_path / "wrong.npz", **expected)
    wrong = load("--expect", str(tmp_path / "wrong.npz"), "--warmup", "0")
    assert wrong.returncode != 0
    assert "11 of 12 answers within" in wrong.stdout and "sample 5" in wrong.stderr
    assert proc.poll() is None
