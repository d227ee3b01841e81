"""tract-ragged: exact variable-width batching for the tract inference engine.

Batch samples of different sizes (text lines, pages, audio, token sequences) into one run,
on CPU or CUDA, and get for every sample exactly what it would have got alone::

    import numpy as np
    import tract_ragged

    model = tract_ragged.Model("rec.onnx", ragged="x:3", input_fact="N,3,48,W,f32")
    lines = [np.zeros((3, 48, w), np.float32) for w in (320, 96, 1200)]
    outputs = model.run(lines)          # outputs[i]: line i's outputs, cropped to its width

A model of several inputs takes one dict per sample (input name to array) and the inputs
given once as ``shared=``. Errors are ``RaggedError`` and its kinds: ``RefusedError``
(the transform refuses a node: ``.node``, ``.op``, ``.reason``), ``BadSampleError``
(``.index``), ``OutOfMemoryError``; files ``OSError``.

``tract_ragged.ray.Predictor`` runs a model over Ray Data's batches.
"""

import os as _os

from ._native import (
    BadSampleError,
    Model,
    OutOfMemoryError,
    RaggedError,
    RefusedError,
    _keep_freed_memory,
    _preferred_isa_edit,
)

# tract-linalg's matmul kernels as this CPU wants them (AVX2 rather than AVX-512 on AMD
# Zen 4, where its AVX-512 ones are slower), unless the user chose: read once, at the first
# model's preparation.
if "TRACT_CPU_ISA" not in _os.environ and _preferred_isa_edit() is not None:
    _os.environ["TRACT_CPU_ISA"] = _preferred_isa_edit()

# glibc keeps freed memory for the next run, as the CLI has it (`_keep_freed_memory`),
# unless the user set glibc's own variables: each run would page-fault its tensors in anew.
_freed_memory_kept = not any(
    k in _os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
) and _keep_freed_memory()

__all__ = [
    "Model",
    "RaggedError",
    "RefusedError",
    "BadSampleError",
    "OutOfMemoryError",
]
