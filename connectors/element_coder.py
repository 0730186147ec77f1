"""A Beam coder for large elements (a poll of messages, an Arrow table) that Beam can size
without encoding them.

Beam's workers sample elements of every PCollection to estimate its byte size: the first
ten always, then fewer and fewer. The default coder estimates a size by pickling the
element whole. Our elements are few and large (one poll: thousands of messages, or
hundreds of MB of Arrow IPC), so that sampling alone copied every byte read: about a
quarter of the Arrow ingest path. This coder pickles exactly as before when an element
really has to cross a stage boundary, and takes sizes from the element's own `nbytes`.
"""

from __future__ import annotations

import pickle

import apache_beam as beam


class SizedPickleCoder(beam.coders.Coder):
    """Pickles elements of one type, which has an `nbytes` property (bytes, roughly)."""

    def __init__(self, element_type: type):
        self.element_type = element_type

    @classmethod
    def from_type_hint(cls, typehint, registry) -> SizedPickleCoder:
        return cls(typehint)

    def encode(self, value) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes):
        return pickle.loads(encoded)

    def estimate_size(self, value) -> int:
        return value.nbytes

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return self.element_type

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.element_type is other.element_type

    def __hash__(self) -> int:
        return hash((type(self), self.element_type))


def register_sized_coder(element_type: type) -> type:
    """Use a SizedPickleCoder for every PCollection typed `element_type` (the transform
    that makes one says `.with_output_types(element_type)`). Usable as a class decorator."""
    beam.coders.registry.register_coder(element_type, SizedPickleCoder)
    return element_type
