"""Lossless codecs for metric series: raw, delta, delta-of-delta and Gorilla-style XOR.

Which codec suits which kind of series (ratios measured by bench/agent.py on real and simulated series):

- ``dod`` (delta-of-delta, the Gorilla paper's timestamp scheme): regular timestamps, steadily rising
  counters - a scrape every 10 s costs one bit;
- ``delta`` (zig-zag varint of differences): integer-valued series that change by small steps (ECC counts,
  clocks in MHz, temperatures in whole degrees);
- ``xor`` (Gorilla's float scheme: XOR with the previous value, store only the meaningful bits): real-valued
  gauges that repeat or drift slowly (utilization, power, loss);
- ``raw``: the fallback for noise, where the others would only add overhead.

``encode(values)`` picks the smallest of the codecs that apply (``codec="auto"``); the choice is stored in a
9-byte header so ``decode`` needs nothing else. Integer codecs also apply to decimal fixed-point values
(``551.2`` at scale 1, millisecond timestamps at scale 3) when scaling round-trips bit for bit. Every codec is
exact: ``decode(encode(x))`` has the same dtype and the same bits, NaNs included.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from vigil.model import VigilInputError

MAGIC = b"VZ"
CODECS = ("raw", "delta", "dod", "xor")
_CODEC_ID = {name: i for i, name in enumerate(CODECS)}
_DTYPES = (np.dtype("float64"), np.dtype("float32"), np.dtype("int64"))
_HEADER = struct.Struct("<2sBBBI")  # magic, codec, dtype, decimal scale, count
_SAMPLE_FOR_CHOICE = 512
_MAX_SCALE = 6
# |value| < 2**61 keeps |delta| < 2**62 and |delta of delta| < 2**63, so each zig-zags into the 64 bits it is given.
_INT_LIMIT = 2**61


# --------------------------------------------------------------------------- bit streams


class BitWriter:
    """Appends bit fields MSB-first; an int accumulator flushed a byte at a time keeps appends O(1)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self._acc = 0
        self._n = 0

    def write(self, value: int, bits: int) -> None:
        self._acc = (self._acc << bits) | (value & ((1 << bits) - 1))
        self._n += bits
        while self._n >= 8:
            self._n -= 8
            self.out.append((self._acc >> self._n) & 0xFF)
        self._acc &= (1 << self._n) - 1

    def getvalue(self) -> bytes:
        if self._n:
            return bytes(self.out) + bytes([(self._acc << (8 - self._n)) & 0xFF])
        return bytes(self.out)


class BitReader:
    """Reads bit fields MSB-first, refilling a small accumulator a byte at a time."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = bytes(data)
        self._pos = 0
        self._acc = 0
        self._n = 0

    def read(self, bits: int) -> int:
        while self._n < bits:
            if self._pos >= len(self._data):
                raise VigilInputError("compressed block is truncated: the bit stream ended early")
            self._acc = (self._acc << 8) | self._data[self._pos]
            self._pos += 1
            self._n += 8
        self._n -= bits
        value = self._acc >> self._n
        self._acc &= (1 << self._n) - 1
        return value


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


# --------------------------------------------------------------------------- integer view of a series


def _as_integers(values: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The series as int64 times 10**scale if that round-trips exactly (bit for bit), else None."""
    if values.dtype == np.int64:
        if values.size and (values.min() <= -_INT_LIMIT or values.max() >= _INT_LIMIT):
            return None
        return values, 0
    if values.size == 0:
        return values.astype(np.int64), 0
    if not np.all(np.isfinite(values)):
        return None
    wide = values.astype(np.float64)
    for scale in range(_MAX_SCALE + 1):
        factor = 10.0**scale
        scaled = np.round(wide * factor)
        if np.max(np.abs(scaled)) >= _INT_LIMIT:
            return None
        ints = scaled.astype(np.int64)
        # Compare through the int64 decode path, so -0.0 (which an integer cannot hold) falls back to XOR.
        back = _from_integers(ints, scale, values.dtype)
        if np.array_equal(back.view(np.uint8), values.view(np.uint8)):
            return ints, scale
    return None


def _from_integers(ints: np.ndarray, scale: int, dtype: np.dtype) -> np.ndarray:
    if dtype == np.int64:
        return ints
    return (ints.astype(np.float64) / 10.0**scale).astype(dtype)


# --------------------------------------------------------------------------- codecs


def _encode_delta(ints: np.ndarray) -> bytes:
    out = bytearray()
    previous = 0
    for value in ints.tolist():
        z = _zigzag(value - previous)
        previous = value
        while z >= 0x80:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        out.append(z)
    return bytes(out)


def _decode_delta(payload: memoryview, count: int) -> np.ndarray:
    ints = np.empty(count, dtype=np.int64)
    previous = position = 0
    data = bytes(payload)
    for i in range(count):
        z = shift = 0
        while True:
            if position >= len(data):
                raise VigilInputError("compressed block is truncated: a varint ran past the end")
            byte = data[position]
            position += 1
            z |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        previous += _unzigzag(z)
        ints[i] = previous
    return ints


# Delta-of-delta buckets (Gorilla, section 4.1.1): prefix bits, value bits (zig-zag).
_DOD_BUCKETS = ((0b10, 2, 7), (0b110, 3, 9), (0b1110, 4, 12))


def _encode_dod(ints: np.ndarray) -> bytes:
    bits = BitWriter()
    values = ints.tolist()
    if not values:
        return b""
    bits.write(_zigzag(values[0]), 64)
    if len(values) == 1:
        return bits.getvalue()
    delta = values[1] - values[0]
    bits.write(_zigzag(delta), 64)
    for previous, value in zip(values[1:], values[2:], strict=False):
        new_delta = value - previous
        dod = new_delta - delta
        delta = new_delta
        if dod == 0:
            bits.write(0, 1)
            continue
        z = _zigzag(dod)
        for prefix, prefix_bits, value_bits in _DOD_BUCKETS:
            if z < (1 << value_bits):
                bits.write(prefix, prefix_bits)
                bits.write(z, value_bits)
                break
        else:
            bits.write(0b1111, 4)
            bits.write(z, 64)
    return bits.getvalue()


def _decode_dod(payload: memoryview, count: int) -> np.ndarray:
    ints = np.empty(count, dtype=np.int64)
    if count == 0:
        return ints
    bits = BitReader(payload)
    value = _unzigzag(bits.read(64))
    ints[0] = value
    if count == 1:
        return ints
    delta = _unzigzag(bits.read(64))
    value += delta
    ints[1] = value
    for i in range(2, count):
        if bits.read(1) == 0:
            dod = 0
        elif bits.read(1) == 0:
            dod = _unzigzag(bits.read(7))
        elif bits.read(1) == 0:
            dod = _unzigzag(bits.read(9))
        elif bits.read(1) == 0:
            dod = _unzigzag(bits.read(12))
        else:
            dod = _unzigzag(bits.read(64))
        delta += dod
        value += delta
        ints[i] = value
    return ints


def _width(dtype: np.dtype) -> int:
    return dtype.itemsize * 8


def _encode_xor(values: np.ndarray) -> bytes:
    width = _width(values.dtype)
    length_bits = 6 if width == 64 else 5
    patterns = values.view(np.uint64 if width == 64 else np.uint32).tolist()
    bits = BitWriter()
    if not patterns:
        return b""
    previous = patterns[0]
    bits.write(previous, width)
    window_lead, window_trail = -1, 0
    for pattern in patterns[1:]:
        x = pattern ^ previous
        previous = pattern
        if x == 0:
            bits.write(0, 1)
            continue
        lead = min(width - x.bit_length(), 31)
        trail = (x & -x).bit_length() - 1
        if window_lead >= 0 and lead >= window_lead and trail >= window_trail:
            # Fits the previous meaningful-bit window: control '10' and just the bits.
            bits.write(0b10, 2)
            bits.write(x >> window_trail, width - window_lead - window_trail)
            continue
        meaningful = width - lead - trail
        bits.write(0b11, 2)
        bits.write(lead, 5)
        bits.write(meaningful - 1, length_bits)
        bits.write(x >> trail, meaningful)
        window_lead, window_trail = lead, trail
    return bits.getvalue()


def _decode_xor(payload: memoryview, count: int, dtype: np.dtype) -> np.ndarray:
    width = _width(dtype)
    length_bits = 6 if width == 64 else 5
    patterns = np.empty(count, dtype=np.uint64 if width == 64 else np.uint32)
    if count == 0:
        return patterns.view(dtype)
    bits = BitReader(payload)
    previous = bits.read(width)
    patterns[0] = previous
    window_lead, window_trail = 0, 0
    for i in range(1, count):
        if bits.read(1) == 1:
            if bits.read(1) == 1:
                window_lead = bits.read(5)
                meaningful = bits.read(length_bits) + 1
                window_trail = width - window_lead - meaningful
                if window_trail < 0:
                    raise VigilInputError("compressed block is corrupt: an XOR window is wider than the value")
            previous ^= bits.read(width - window_lead - window_trail) << window_trail
        patterns[i] = previous
    return patterns.view(dtype)


# --------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class Encoded:
    codec: str
    data: bytes

    @property
    def ratio(self) -> float:
        """Raw size over encoded size."""
        count = _HEADER.unpack_from(self.data)[4]
        dtype = _DTYPES[_HEADER.unpack_from(self.data)[2]]
        return (count * dtype.itemsize) / max(1, len(self.data))


def _check_input(values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values)
    if values.ndim != 1:
        raise VigilInputError(f"a series to compress must be one-dimensional, got shape {values.shape}")
    if values.dtype not in _DTYPES:
        raise VigilInputError(f"cannot compress dtype {values.dtype}: expected float64, float32 or int64")
    if len(values) >= 2**32:
        raise VigilInputError("a series to compress must have fewer than 2**32 values")
    return values


def _encode_with(values: np.ndarray, codec: str, ints: tuple[np.ndarray, int] | None) -> bytes:
    dtype_id = _DTYPES.index(values.dtype)
    scale = 0
    if codec == "raw":
        payload = values.tobytes()
    elif codec == "xor":
        if values.dtype == np.int64:
            raise VigilInputError("the xor codec is for floats; use delta or dod for integers")
        payload = _encode_xor(values)
    elif codec in ("delta", "dod"):
        if ints is None:
            raise VigilInputError(f"the {codec} codec needs integer or fixed-point values")
        int_values, scale = ints
        payload = _encode_delta(int_values) if codec == "delta" else _encode_dod(int_values)
    else:
        raise VigilInputError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)} or auto")
    return _HEADER.pack(MAGIC, _CODEC_ID[codec], dtype_id, scale, len(values)) + payload


def applicable_codecs(values: np.ndarray) -> list[str]:
    values = _check_input(values)
    codecs = ["raw"]
    if values.dtype != np.int64:
        codecs.append("xor")
    if _as_integers(values) is not None:
        codecs += ["delta", "dod"]
    return codecs


def encode(values: np.ndarray, codec: str = "auto") -> Encoded:
    """Compress one series; ``auto`` tries every applicable codec on a prefix and keeps the smallest."""
    values = _check_input(values)
    ints = _as_integers(values)
    if codec != "auto":
        return Encoded(codec, _encode_with(values, codec, ints))
    candidates = ["xor"] if values.dtype != np.int64 else []
    if ints is not None:
        candidates += ["delta", "dod"]
    prefix = values[:_SAMPLE_FOR_CHOICE]
    prefix_ints = None if ints is None else (ints[0][:_SAMPLE_FOR_CHOICE], ints[1])
    best = min(candidates, key=lambda c: len(_encode_with(prefix, c, prefix_ints)), default="raw")
    data = _encode_with(values, best, ints)
    raw = _encode_with(values, "raw", ints)
    return Encoded("raw", raw) if len(raw) <= len(data) else Encoded(best, data)


def decode(blob: bytes) -> np.ndarray:
    """The exact series a block was made from; a corrupt or truncated block raises VigilInputError."""
    if len(blob) < _HEADER.size:
        raise VigilInputError(f"compressed block too short: {len(blob)} bytes, the header alone is {_HEADER.size}")
    magic, codec_id, dtype_id, scale, count = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise VigilInputError(f"not a compressed series block: magic {magic!r}, expected {MAGIC!r}")
    if codec_id >= len(CODECS) or dtype_id >= len(_DTYPES) or scale > _MAX_SCALE:
        raise VigilInputError(f"compressed block header is corrupt (codec {codec_id}, dtype {dtype_id}, scale {scale})")
    codec, dtype = CODECS[codec_id], _DTYPES[dtype_id]
    payload = memoryview(blob)[_HEADER.size :]
    if codec == "raw":
        if len(payload) != count * dtype.itemsize:
            raise VigilInputError(f"raw block holds {len(payload)} bytes, expected {count * dtype.itemsize}")
        return np.frombuffer(payload, dtype=dtype).copy()
    if codec == "xor":
        return _decode_xor(payload, count, dtype)
    ints = _decode_delta(payload, count) if codec == "delta" else _decode_dod(payload, count)
    return _from_integers(ints, scale, dtype)
