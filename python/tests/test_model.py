"""tract_ragged from Python: the same outputs as the Rust API and the CLI, samples of one
input and of several, errors by kind, keep-going, and many threads on one model.

Run by scripts/test.sh after the wheel is built and installed (scripts/python.sh); the
CLI they compare with is TRACT_RAGGED_BIN, else the workspace's debug build.
"""

import gc
import os
import pathlib
import subprocess
import tempfile
import threading

import numpy as np
import pytest

import tract_ragged

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZOO = ROOT / "fixtures" / "zoo"
IMAGE = ZOO / "tv_mobilenet_v3.onnx"
STATEFUL = ROOT / "fixtures" / "encoders" / "stateful" / "model.onnx"
CLI = os.environ.get("TRACT_RAGGED_BIN", str(ROOT / "target" / "debug" / "tract-ragged"))


def images(widths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (3, 64, w)).astype(np.float32) for w in widths]


@pytest.fixture(scope="module")
def image_model():
    return tract_ragged.Model(IMAGE, "x:3", input_fact="N,3,64,W,f32")


def worst(found, expected):
    assert len(found) == len(expected)
    d = 0.0
    for f, e in zip(found, expected):
        assert len(f) == len(e)
        for a, b in zip(f, e):
            assert a.shape == b.shape and a.dtype == b.dtype
            d = max(d, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0)))
    return d


def cli_run(model, samples, extra, ragged="x:3", fact="N,3,64,W,f32"):
    """`tract-ragged run` on the samples; each sample's outputs, in order."""
    with tempfile.TemporaryDirectory() as d:
        inp, out = pathlib.Path(d, "in.npz"), pathlib.Path(d, "out.npz")
        np.savez(inp, **{f"s{i:03}": s for i, s in enumerate(samples)})
        subprocess.run(
            [CLI, "run", str(model), "--ragged", ragged, "--input-fact", fact,
             "--samples", str(inp), "--out", str(out), *extra],
            check=True, capture_output=True,
        )
        with np.load(out) as z:
            outs = {}
            for name in z.files:
                s, o = name[1:].split("_o")
                outs.setdefault(int(s), {})[int(o)] = z[name]
    return [[outs[i][j] for j in sorted(outs[i])] for i in sorted(outs)]


def test_outputs_are_the_rust_apis_bit_for_bit(image_model):
    lines = images([64, 40, 96, 33, 71])
    alone = image_model.run_one_by_one(lines)
    assert worst(alone, cli_run(IMAGE, lines, ["--one-by-one"])) == 0.0
    singles = tract_ragged.Model(IMAGE, "x:3", input_fact="N,3,64,W,f32", max_batch=1)
    assert worst(singles.run(lines), cli_run(IMAGE, lines, ["--batch", "1"])) == 0.0
    # Scheduled batches of any composition: what each image gets alone.
    assert worst(image_model.run(lines), alone) <= 1e-5
    assert worst(image_model.run_batch(lines), alone) <= 1e-5


def test_layouts_and_types_are_read_as_numpy_has_them(image_model):
    wide = images([80, 114])
    # A strided view (every other column) and a Fortran-order copy: read as numpy has them.
    views = [wide[0][:, :, ::2], np.asfortranarray(wide[1])]
    copies = [np.ascontiguousarray(v) for v in views]
    assert not views[0].flags.c_contiguous and not views[1].flags.c_contiguous
    assert worst(image_model.run_one_by_one(views), image_model.run_one_by_one(copies)) == 0.0
    with pytest.raises(tract_ragged.BadSampleError):
        image_model.run([copies[0].astype(np.float64)])
    with pytest.raises(TypeError):
        image_model.run([[1.0, 2.0]])


def test_several_inputs_by_name_and_shared():
    model = tract_ragged.Model(STATEFUL, "x:1", input_fact="N,T,4,f32")
    assert model.inputs == [("x", "ragged"), ("state", "per_sample"), ("gain", "shared")]
    rng = np.random.default_rng(3)
    clips = [
        {"x": rng.uniform(-1, 1, (t, 4)).astype(np.float32),
         "state": rng.uniform(-1, 1, (8,)).astype(np.float32)}
        for t in (1, 3, 8, 20, 13)
    ]
    shared = {"gain": np.float32(1.5) * np.ones((), np.float32)}
    alone = model.run_one_by_one(clips, shared)
    assert worst(model.run(clips, shared), alone) <= 1e-5
    with pytest.raises(tract_ragged.RaggedError, match="shared input"):
        model.run(clips)
    bad = list(clips)
    bad[2] = {"x": clips[2]["x"]}
    answers = model.run(bad, shared, keep_going=True)
    assert isinstance(answers[2], tract_ragged.BadSampleError)
    assert answers[2].index == 2 and answers[2].input == "state" and answers[2].name is None
    assert "lacks input" in str(answers[2])
    good = [a for i, a in enumerate(answers) if i != 2]
    assert worst(good, [a for i, a in enumerate(alone) if i != 2]) <= 1e-5
    with pytest.raises(tract_ragged.BadSampleError) as e:
        model.run(bad, shared)
    assert e.value.index == 2


def test_errors_have_their_kind():
    refused = ZOO / "tv_swin.onnx"
    with pytest.raises(tract_ragged.RefusedError) as e:
        tract_ragged.Model(refused, "x:3", input_fact="N,3,64,W,f32")
    assert e.value.node and e.value.op and e.value.reason
    with pytest.raises(OSError):
        tract_ragged.Model(ZOO / "no_such_model.onnx", "x:3")
    with pytest.raises(ValueError):
        tract_ragged.Model(IMAGE, "x:3", input_fact="N,3,64,W,f32", runtime="tpu")


def test_eight_threads_share_one_model(image_model):
    widths = [33, 40, 57, 64, 71, 96, 45, 88]
    lines = images(widths, seed=5)
    expected = image_model.run_one_by_one(lines)
    results, errors = {}, []

    def work(k):
        try:
            mine = [lines[(k + i) % len(lines)] for i in range(6)]
            results[k] = (k, image_model.run(mine))
        except Exception as e:  # noqa: BLE001: reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, outs in results.values():
        mine = [expected[(k + i) % len(lines)] for i in range(6)]
        assert worst(outs, mine) <= 1e-5


def test_profile_is_a_dict_of_node_timings(image_model):
    profile = image_model.profile(images([40, 64]), runs=2, cost=True)
    assert isinstance(profile, dict)
    nodes = profile["nodes"]
    assert len(nodes) > 10
    assert any(n.get("secs_per_iter") for n in nodes), nodes[:3]


def test_outputs_are_numpy_arrays_of_their_own(image_model):
    """Outputs are arrays over the output tensors' memory: they outlive the model and
    the list they came in, views of them too, and they can be written."""
    lines = images([40, 71, 33])
    model = tract_ragged.Model(IMAGE, "x:3", input_fact="N,3,64,W,f32")
    outs = model.run(lines)
    kept = [[a.copy() for a in o] for o in outs]
    view = outs[1][0][1:]
    del model, outs
    gc.collect()
    assert np.array_equal(view, kept[1][0][1:])
    view[...] = 0
    assert not view.any()
    assert worst(image_model.run(lines), kept) <= 1e-5


def test_import_sets_the_matmul_kernels_this_cpu_wants():
    """On AMD Zen 4 the package asks tract-linalg for its AVX2 kernels (TRACT_CPU_ISA), unless
    the user chose; a user's choice is kept."""
    import sys

    code = "import os, tract_ragged; print(os.environ.get('TRACT_CPU_ISA'))"
    env = {k: v for k, v in os.environ.items() if k != "TRACT_CPU_ISA"}
    chosen = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert chosen.stdout.strip() == str(tract_ragged._native._preferred_isa_edit())
    env["TRACT_CPU_ISA"] = "+fma"
    kept = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert kept.stdout.strip() == "+fma"


def test_import_keeps_freed_memory_unless_the_user_set_glibc():
    """Importing the package has glibc serve blocks up to 64 MiB from its heap (as the CLI
    does), unless the user set glibc's own variables: a 48 MiB block (above glibc's own
    largest mapping threshold, 32 MiB) is mapped apart by default, from the heap here."""
    import sys

    code = """
import ctypes, tract_ragged
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2().hblkhd
p = libc.malloc(48 << 20)
mapped = libc.mallinfo2().hblkhd - before >= 48 << 20
libc.free(p)
print(tract_ragged._freed_memory_kept, mapped)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    kept = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert kept.stdout.split() == ["True", "False"], kept
    env["MALLOC_TRIM_THRESHOLD_"] = "131072"
    chosen = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert chosen.stdout.split() == ["False", "True"], chosen


def test_inputs_read_in_place_never_leak_into_outputs():
    """Samples are packed from the arrays' own memory; a model that passes an input through
    still answers arrays of their own, valid once the inputs are gone."""
    # x: [N, 4, W] f32 -> same = Identity(x), neg = Neg(x) (written by onnx.helper).
    path = ROOT / "fixtures" / "encoders" / "through.onnx"
    model = tract_ragged.Model(path, "x:2", input_fact="N,4,W,f32")
    widths = [5, 9, 2]
    for verb in (model.run, model.run_batch, model.run_one_by_one,
                 lambda s: model.run(s, keep_going=True)):
        samples = [np.full((4, w), float(w), np.float32) for w in widths]
        answers = verb(samples)
        for s, (same, neg) in zip(samples, answers):
            assert not np.shares_memory(same, s) and not np.shares_memory(neg, s)
        del samples
        gc.collect()
        np.full((1 << 20,), -7.0, np.float32)  # memory the inputs had, reused
        for w, (same, neg) in zip(widths, answers):
            assert same.shape == (4, w) and (same == w).all() and (neg == -w).all()
