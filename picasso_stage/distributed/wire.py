"""The parameter server's messages as bytes, without pickle.

A server that unpickled what it was sent would run whatever code a caller sent, token or
not. So a message is built only of None, bools, ints, floats, strings, lists, tuples,
str-keyed dicts, torch tensors and the dataclasses registered here (the contracts between
workers and shards), and the decoder builds nothing else.

Layout: b"PSW1", the header's length (8 bytes, little-endian), a JSON header describing
the value (each tensor as its dtype, shape and index), then every tensor's bytes, one
after the other. Tensors are written once, straight from their storage, and read back as
views of the received bytes: a pull of 1 MB of rows costs one copy into the message and
none out of it. Decoded tensors are read-only by contract (they share the message's
memory); whoever changes one clones it first.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import torch

_MAGIC = b"PSW1"
_registry: dict[str, type] = {}


def register(*classes: type) -> None:
    """Let these dataclasses travel (by class name: names must be unique)."""
    for cls in classes:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        known = _registry.setdefault(cls.__name__, cls)
        if known is not cls:
            raise ValueError(f"two message classes are named {cls.__name__}")


class WireError(ValueError):
    """The bytes are not a message this side can read."""


def encode(value) -> bytes:
    tensors: list[torch.Tensor] = []
    header = json.dumps(_describe(value, tensors), separators=(",", ":")).encode()
    parts: list = [_MAGIC, len(header).to_bytes(8, "little"), header]
    parts += [memoryview(t.numpy()) for t in tensors]
    return b"".join(parts)


def decode(data: bytes):
    if data[:4] != _MAGIC:
        raise WireError("not a parameter-server message (bad magic)")
    length = int.from_bytes(data[4:12], "little")
    try:
        header = json.loads(bytes(data[12:12 + length]))
    except ValueError as err:
        raise WireError(f"unreadable message header: {err}") from None
    reader = _TensorReader(data, 12 + length)
    with warnings.catch_warnings():  # that the received bytes are not writable: see "read-only by contract"
        warnings.simplefilter("ignore", UserWarning)
        value = _build(header, reader)
    if reader.at != len(data):
        raise WireError(f"message has {len(data) - reader.at} bytes past its tensors")
    return value


def _describe(value, tensors: list[torch.Tensor]):
    """The JSON-able header of `value`; its tensors, as flat bytes, appended to `tensors`."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        tensors.append(flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8))
        return {"t": str(flat.dtype).removeprefix("torch."), "s": list(value.shape)}
    if isinstance(value, (list, tuple)):
        items = [_describe(item, tensors) for item in value]
        return {"l": items} if isinstance(value, list) else {"u": items}
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("message dicts must have str keys")
        return {"d": {key: _describe(item, tensors) for key, item in value.items()}}
    cls = type(value)
    if _registry.get(cls.__name__) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message type")
    fields = {f.name: _describe(getattr(value, f.name), tensors) for f in dataclasses.fields(value) if f.init}
    return {"c": cls.__name__, "f": fields}


class _TensorReader:
    def __init__(self, data: bytes, at: int):
        self.data, self.at = data, at

    def take(self, dtype_name: str, shape: list[int]) -> torch.Tensor:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise WireError(f"unknown tensor dtype {dtype_name!r}")
        count = 1
        for size in shape:
            count *= size
        size = count * torch.empty((), dtype=dtype).element_size()
        if self.at + size > len(self.data):
            raise WireError("message ends inside a tensor")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        tensor = torch.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += size
        return tensor.view(shape)


def _build(header, reader: _TensorReader):
    if header is None or isinstance(header, (bool, int, float, str)):
        return header
    if not isinstance(header, dict) or len(header) not in (1, 2):
        raise WireError("malformed message header")
    if "t" in header:
        return reader.take(header["t"], header["s"])
    if "l" in header:
        return [_build(item, reader) for item in header["l"]]
    if "u" in header:
        return tuple(_build(item, reader) for item in header["u"])
    if "d" in header:
        return {key: _build(item, reader) for key, item in header["d"].items()}
    cls = _registry.get(header.get("c"))
    if cls is None:
        raise WireError(f"message type {header.get('c')!r} is not one this side reads")
    return cls(**{key: _build(item, reader) for key, item in header["f"].items()})
