"""Codecs are exact, pick the right kind of series, and reject corrupt blocks with a clear error."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vigil.model import VigilInputError
from vigil.store.compress import CODECS, applicable_codecs, decode, encode


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@settings(max_examples=150, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from([np.float64, np.float32]),
        st.integers(0, 300),
        elements={"allow_nan": True, "allow_infinity": True},
    )
)
def test_every_applicable_codec_round_trips_floats_bit_for_bit(values: np.ndarray) -> None:
    for codec in applicable_codecs(values):
        assert same_bits(decode(encode(values, codec).data), values), codec
    assert same_bits(decode(encode(values).data), values)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(-(2**61) + 1, 2**61 - 1)))
def test_integer_codecs_round_trip_int64(values: np.ndarray) -> None:
    for codec in ("raw", "delta", "dod", "auto"):
        assert same_bits(decode(encode(values, codec).data), values), codec


def test_swings_too_wide_for_64_bit_deltas_of_deltas_still_round_trip() -> None:
    """A swing from about +2**62 to -2**62 and back has a delta of delta near 2**64, which zig-zags past 64 bits."""
    ints = np.array([2**62 - 1, -(2**62) + 1, 2**62 - 1, 5], dtype=np.int64)
    floats = np.array([1.8014398509481984e16, -3.162725190000001e16, 1.8014398509481984e16, 0.62])
    for values in (ints, floats):
        for codec in applicable_codecs(values):
            assert same_bits(decode(encode(values, codec).data), values), codec
        assert same_bits(decode(encode(values).data), values)


def test_each_kind_of_series_gets_its_codec() -> None:
    rng = np.random.default_rng(0)
    timestamps = 1.7e9 + np.arange(4000) * 10.0
    assert encode(timestamps).codec == "dod"
    assert encode(timestamps).ratio > 40  # ~1 bit per regular timestamp
    temperature = np.round(60 + np.cumsum(rng.normal(0, 0.05, 4000))).astype(np.float32)
    assert encode(temperature).codec in ("xor", "dod") and encode(temperature).ratio > 5
    millis = 1.7e9 + np.round(np.arange(4000) * 10.0 + rng.normal(0, 0.02, 4000), 3)
    assert encode(millis).codec == "dod" and encode(millis).ratio > 3  # fixed-point at scale 3
    noise = rng.normal(size=4000)
    assert encode(noise).codec == "raw" and encode(noise).ratio == pytest.approx(1.0, abs=0.01)


def test_real_server_metrics_compress(shared_data: Path) -> None:
    with gzip.open(shared_data / "smd" / "processed" / "machine-1-2_test.pkl.gz") as fh:
        matrix = np.asarray(pickle.load(fh), dtype=np.float32)
    raw = sum(matrix[:, j].nbytes for j in range(matrix.shape[1]))
    packed = sum(len(encode(np.ascontiguousarray(matrix[:, j])).data) for j in range(matrix.shape[1]))
    assert raw / packed > 1.5
    column = np.ascontiguousarray(matrix[:, 0])
    assert same_bits(decode(encode(column).data), column)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:5], "too short"),
        (lambda b: b"XX" + b[2:], "magic"),
        (lambda b: b[:2] + bytes([9]) + b[3:], "header is corrupt"),
        (lambda b: b[:-3], "truncated"),
    ],
)
def test_corrupt_blocks_raise_a_clear_error(mutate, message: str) -> None:
    block = encode(1.7e9 + np.arange(100) * 10.0, "delta").data
    with pytest.raises(VigilInputError, match=message):
        decode(mutate(block))


def test_bad_input_is_refused() -> None:
    with pytest.raises(VigilInputError, match="one-dimensional"):
        encode(np.zeros((2, 2)))
    with pytest.raises(VigilInputError, match="dtype"):
        encode(np.zeros(3, dtype=np.int8))
    with pytest.raises(VigilInputError, match="fixed-point"):
        encode(np.array([0.1234567891234]), "delta")
    with pytest.raises(VigilInputError, match="unknown codec"):
        encode(np.zeros(3), "zstd")
    assert set(CODECS) == {"raw", "delta", "dod", "xor"}
