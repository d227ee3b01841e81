"""tract_ragged.ray.Predictor on a real local Ray cluster: map_batches with two actors over
a few hundred rows of different widths; every row what its image gets alone, none lost,
order kept."""

import pathlib

import numpy as np
import pytest
import ray

import tract_ragged
from tract_ragged.ray import Predictor

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = ROOT / "fixtures" / "zoo" / "tv_mobilenet_v3.onnx"
KWARGS = dict(path=str(IMAGE), ragged="x:3", input_fact="N,3,64,W,f32")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    yield
    ray.shutdown()


def test_two_actors_answer_every_row_in_order(cluster):
    rng = np.random.default_rng(7)
    widths = [int(w) for w in rng.integers(24, 120, 300)]
    rows = [{"id": i, "x": rng.uniform(-1, 1, (3, 64, w)).astype(np.float32)}
            for i, w in enumerate(widths)]
    ds = ray.data.from_items(rows)
    out = ds.map_batches(
        Predictor,
        fn_constructor_kwargs=KWARGS,
        batch_size=32,
        concurrency=2,
        batch_format="numpy",
    ).take_all()
    assert [r["id"] for r in out] == list(range(300)), "rows lost or reordered"
    model = tract_ragged.Model(IMAGE, "x:3", input_fact="N,3,64,W,f32")
    (name,) = model.outputs
    alone = model.run_one_by_one([r["x"] for r in rows])
    for r, a in zip(out, alone):
        found = np.asarray(r[name])
        assert found.shape == a[0].shape
        assert float(np.abs(found - a[0]).max()) <= 1e-5, f"row {r['id']}"
    assert "x" not in out[0], "the input column is consumed"


def test_keep_going_names_the_bad_rows(cluster):
    rows = [{"x": np.zeros((3, 64, 40), np.float32)}, {"x": np.zeros((3, 64), np.float32)},
            {"x": np.zeros((3, 64, 50), np.float32)}]
    out = ray.data.from_items(rows).map_batches(
        Predictor,
        fn_constructor_kwargs=dict(KWARGS, keep_going=True),
        batch_size=8,
        concurrency=1,
        batch_format="numpy",
    ).take_all()
    assert [r["error"] == "" for r in out] == [True, False, True]
    assert "sample 1" in out[1]["error"]
