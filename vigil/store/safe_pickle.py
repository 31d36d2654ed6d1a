"""Read pickles as data only: no pickle a user hands Vigil can run code.

``pickle.load`` calls whatever class or function a pickle names (``os.system`` included). These
unpicklers resolve no name at all (Flight Recorder dumps: dicts, lists, strings, numbers), or only the
three numpy names a plain ``ndarray`` needs (the ASD / SMD data sets), and refuse everything else.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from vigil.model import VigilInputError


class DataOnlyUnpickler(pickle.Unpickler):
    """Builtin containers and scalars only: every global a pickle names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load class {module}.{name}: only plain data is read")


def _reconstruct(cls: Any, shape: Any, dtype: Any) -> np.ndarray:
    if cls is not np.ndarray:
        raise pickle.UnpicklingError("refusing an ndarray subclass")
    return np.ndarray.__new__(np.ndarray, shape, dtype)


# What ``pickle.dumps(np.ndarray)`` names, under numpy 1.x and 2.x module paths.
_NDARRAY_NAMES: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class NumpyArrayUnpickler(DataOnlyUnpickler):
    """Plain data plus ``numpy.ndarray`` of a numeric dtype (checked after loading)."""

    def find_class(self, module: str, name: str) -> Any:
        found = _NDARRAY_NAMES.get((module, name))
        return found if found is not None else super().find_class(module, name)


# What a malformed pickle raises inside the unpickler (truncation, bad opcodes, wrong argument shapes).
PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
                 MemoryError, RecursionError, OverflowError)


def load_data(raw: bytes, where: str) -> Any:
    """Unpickle ``raw`` as plain data; anything else is one line naming ``where``."""
    try:
        return DataOnlyUnpickler(io.BytesIO(raw)).load()
    except PICKLE_ERRORS as err:
        raise VigilInputError(f"{where}: not a data-only pickle ({err})") from None


def load_data_with_arrays(raw: bytes, where: str) -> Any:
    """Unpickle plain data that may hold numeric numpy arrays (e.g. ``np.random.get_state()``)."""
    try:
        return NumpyArrayUnpickler(io.BytesIO(raw)).load()
    except PICKLE_ERRORS as err:
        raise VigilInputError(f"{where}: not a data-only pickle ({err})") from None


def load_array(raw: bytes, where: str) -> np.ndarray:
    """Unpickle a numeric numpy array (or nested lists of numbers); an object array is refused."""
    try:
        loaded = NumpyArrayUnpickler(io.BytesIO(raw)).load()
        array = np.asarray(loaded)
    except PICKLE_ERRORS as err:
        raise VigilInputError(f"{where}: not a numeric numpy pickle ({err})") from None
    if array.dtype.kind not in "biuf":
        raise VigilInputError(f"{where}: expected a numeric array, got dtype {array.dtype}")
    return array
