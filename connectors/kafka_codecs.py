"""Kafka's compression codecs as kafka-python reads them: which ones this environment can
decompress, and the error that stops a read when a record batch uses one it cannot.

kafka-python decompresses gzip with the standard library and every other codec with an
optional package (the packages below are picasso-stage dependencies, so a complete
install reads all four). Without the package, the poll that meets such a batch raises
UnsupportedCodecError and the position stays where it was; kafka-python 3.0.12 then
spins for ever inside the next poll of that consumer (the failed batch is never
drained). Re-reading meets the same batch again, so retrying cannot help: the error
becomes CodecUnavailable, which names where it happened and what to install, and tells
the stream not to retry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import kafka.codec
from kafka.errors import UnsupportedCodecError

log = logging.getLogger(__name__)

# The package that lets kafka-python read each codec (its extras of the same names);
# None: the standard library's.
PACKAGES = {"gzip": None, "snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


class CodecUnavailable(RuntimeError):
    """A record batch is compressed with a codec that kafka-python cannot read here."""

    # Every retry meets the same batch: stop instead of retrying the cycle.
    retryable = False

    def __init__(self, message: str, codec: str | None = None):
        # Beam re-raises a DoFn's error as type(err)(args[0] + " [while running ...]",
        # *args[1:]); with the codec in args that copy keeps this type and the codec.
        super().__init__(message, codec)
        self.codec = codec

    def __str__(self) -> str:
        return self.args[0]

    @classmethod
    def at(cls, where: str, codec: str) -> CodecUnavailable:
        return cls(f"{where}: a record batch is compressed with {codec}, which kafka-python cannot decompress "
                   f"in this environment ({_remedy(codec)})", codec)

    @property
    def package(self) -> str | None:
        return PACKAGES.get(self.codec)

    @classmethod
    def raised_in(cls, error: BaseException) -> bool:
        """Whether a pipeline failed with this error, in the form its runner hands it back:
        in process (FnApiRunner, DirectRunner), a copy of this type; with several local
        workers (threads or processes), a RuntimeError whose text is the worker's
        traceback, which names this type."""
        return isinstance(error, cls) or f"{cls.__module__}.{cls.__qualname__}: " in str(error)


def available_codecs() -> dict[str, bool]:
    """Codec name -> whether kafka-python can decompress it here (its own checks)."""
    return {name: getattr(kafka.codec, f"has_{name}")() for name in PACKAGES}


def check_codecs() -> dict[str, bool]:
    """available_codecs(), with a warning that names what to install for each missing one."""
    available = available_codecs()
    missing = [name for name, ok in available.items() if not ok]
    if missing:
        log.warning("kafka-python cannot decompress %s here; a batch compressed with it stops the read (%s)",
                    ", ".join(missing), "; ".join(f"{name}: {_remedy(name)}" for name in missing))
    else:
        log.debug("kafka-python decompresses every Kafka codec here: %s", ", ".join(available))
    return available


@contextmanager
def naming_missing_codec(where: str) -> Iterator[None]:
    """Turn kafka-python's UnsupportedCodecError, raised inside, into CodecUnavailable at `where`."""
    try:
        yield
    except UnsupportedCodecError as err:
        raise CodecUnavailable.at(where, _codec_named_in(err)) from err


def _remedy(codec: str) -> str:
    if codec not in PACKAGES:
        return "no Kafka client knows this codec"
    package = PACKAGES[codec]
    return f"pip install {package}" if package else "it needs the zlib module of Python's standard library"


def _codec_named_in(error: UnsupportedCodecError) -> str:
    # kafka-python names the codec only in its message: "Libraries for snappy compression
    # codec not found", or "Unrecognized compression type: 5" for an id no client knows.
    text = str(error).lower()
    return next((name for name in PACKAGES if name in text), f"an unknown codec ({error})")
