"""Ray Data: a tract-ragged model over ``Dataset.map_batches``.

::

    import ray
    from tract_ragged.ray import Predictor

    ds = ray.data.from_items([{"x": line} for line in lines])   # variable-width rows
    out = ds.map_batches(
        Predictor,
        fn_constructor_kwargs=dict(path="rec.onnx", ragged="x:3", input_fact="N,3,48,W,f32",
                                   runtime="cuda"),
        batch_size=256, concurrency=2, num_gpus=1,
    )

Each actor opens the model once (its constructor takes ``tract_ragged.Model``'s
arguments) and runs every batch Ray gives it through the ragged scheduler, so rows of any
widths are batched exactly. A batch's columns named after the model's inputs are its
samples (object arrays of variable-shaped rows, Ray's variable-shaped tensors, or fixed
shapes alike); the inputs the model shares come as ``shared=`` to the constructor. The
result has every other column of the batch as it was, and one column per model output,
named after it, one array per row, rows in their order. With ``keep_going=True`` a row
that fails gets its error's text in an ``error`` column (empty where it ran) and empty
outputs, instead of failing the batch.
"""

from typing import Any, Dict, Mapping, Optional

import numpy as np

from ._native import Model


def _column(values) -> np.ndarray:
    """One array per row, as an object array (rows of different shapes stay apart)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


class Predictor:
    """A callable class for ``map_batches`` (module doc)."""

    def __init__(
        self,
        path,
        ragged: str,
        *,
        shared: Optional[Mapping[str, np.ndarray]] = None,
        keep_going: bool = False,
        **model_kwargs: Any,
    ):
        self.model = Model(path, ragged, **model_kwargs)
        self.given = [name for name, role in self.model.inputs if role != "shared"]
        self.shared = dict(shared or {})
        self.keep_going = keep_going
        self.output_names = self.model.outputs

    def _samples(self, batch: Mapping[str, Any]):
        missing = [n for n in self.given if n not in batch]
        if missing:
            raise KeyError(
                f"the batch has no column for the model's input(s) {missing} "
                f"(columns: {sorted(batch)})"
            )
        rows = len(batch[self.given[0]])
        if len(self.given) == 1:
            (name,) = self.given
            return [np.asarray(batch[name][i]) for i in range(rows)]
        return [{n: np.asarray(batch[n][i]) for n in self.given} for i in range(rows)]

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, np.ndarray]:
        samples = self._samples(batch)
        answers = self.model.run(samples, self.shared or None, keep_going=self.keep_going)
        out = {k: v for k, v in batch.items() if k not in self.given}
        errors = []
        for j, name in enumerate(self.output_names):
            values = []
            for a in answers:
                values.append(np.empty(0, np.float32) if isinstance(a, Exception) else a[j])
            out[name] = _column(values)
        if self.keep_going:
            errors = ["" if not isinstance(a, Exception) else str(a) for a in answers]
            out["error"] = np.array(errors, dtype=object)
        return out
