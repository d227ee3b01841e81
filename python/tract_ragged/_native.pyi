from os import PathLike
from typing import Mapping, Optional, Sequence, Union

import numpy as np

Array = np.ndarray
SampleIn = Union[Array, Mapping[str, Array]]

def _preferred_isa_edit() -> Optional[str]: ...
def _keep_freed_memory() -> bool: ...

class RaggedError(Exception): ...

class RefusedError(RaggedError):
    node: str
    op: str
    reason: str

class BadSampleError(RaggedError):
    index: int
    input: Optional[str]
    name: Optional[str]

class OutOfMemoryError(RaggedError): ...

class Model:
    def __init__(
        self,
        path: Union[str, PathLike],
        ragged: str,
        *,
        input_fact: Optional[Union[str, Sequence[str]]] = None,
        runtime: str = "cpu",
        precision: str = "f32",
        top_k: Optional[int] = None,
        memory: Optional[int] = None,
        lanes: Optional[int] = None,
        max_batch: Optional[int] = None,
        folded: Optional[Mapping[str, Array]] = None,
        knobs: Optional[Mapping[str, object]] = None,
    ) -> None: ...
    def run(
        self,
        samples: Sequence[SampleIn],
        shared: Optional[Mapping[str, Array]] = None,
        *,
        keep_going: bool = False,
    ) -> list[Union[list[Array], RaggedError]]: ...
    def run_one_by_one(
        self, samples: Sequence[SampleIn], shared: Optional[Mapping[str, Array]] = None
    ) -> list[list[Array]]: ...
    def run_batch(
        self, samples: Sequence[SampleIn], shared: Optional[Mapping[str, Array]] = None
    ) -> list[list[Array]]: ...
    def profile(
        self, samples: Sequence[Array], *, runs: int = 5, cost: bool = False
    ) -> dict: ...
    @property
    def inputs(self) -> list[tuple[str, str]]: ...
    @property
    def outputs(self) -> list[str]: ...
    @property
    def runtime(self) -> str: ...
    @property
    def metadata(self) -> dict[str, str]: ...
