"""Where picasso keeps its state: a local path, or a URL on a filesystem the host provides.

Every folder of a run (the data root, the work folder, checkpoints, the publish outbox,
run results) may be a local path or a URL (`s3://`, `gs://`, `hdfs://`, ...). Code that
keeps state calls these functions with either, and never `pathlib` or `open` directly.

picasso never imports Beam, so URLs are served by a backend the host registers
(register_remote): where picasso's commands and pipelines start, Beam's
`apache_beam.io.filesystems` (connectors/beam_files.py, registered by
connectors/beam_urls.py's serve_urls_through_beam, which says where it is called), whose
settings come from the same pipeline options the user passes (`--s3_endpoint_url`, GCS
credentials, ...) on the driver and on every worker. Local paths are served here.

What one write guarantees, on either kind:
- `write_bytes` is all or nothing: a reader sees the old object or the whole new one. An
  object store's put is atomic; a local file is written under a temporary name, fsynced
  and renamed.
- Nothing else is atomic on an object store: there is no rename of a folder, so a group of
  files is committed by a marker written last (see checkpoint.py).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from collections.abc import Callable
from typing import BinaryIO, Protocol

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class RemoteFiles(Protocol):
    """What a backend for URLs does. Folders are prefixes: they exist while they hold a file."""

    def read(self, url: str) -> bytes: ...

    def open(self, url: str) -> BinaryIO:
        """For reading, seekable."""

    def write(self, url: str, data: bytes) -> None: ...

    def exists(self, url: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Every file's URL under prefix, at any depth."""

    def delete(self, urls: list[str]) -> None: ...

    def copy(self, sources: list[str], destinations: list[str]) -> None: ...


_make_remote: Callable[[], RemoteFiles] | None = None
_remote: RemoteFiles | None = None


def register_remote(make: Callable[[], RemoteFiles]) -> None:
    """Serve every URL through the backend `make()` builds, when one is first needed (so
    registering costs nothing to a process that never touches a URL)."""
    global _make_remote, _remote
    _make_remote, _remote = make, None


def serves_urls() -> bool:
    """Whether a backend for URLs is registered in this process."""
    return _make_remote is not None


def is_url(path: str | Path) -> bool:
    """A URL with a scheme other than file://, which a registered backend serves."""
    text = str(path)
    return bool(_URL.match(text)) and not text.startswith("file://")


def _local(path: str | Path) -> Path:
    text = str(path)
    return Path(text[len("file://"):] if text.startswith("file://") else text)


def _backend(url: str) -> RemoteFiles:
    global _remote
    if _remote is None:
        if _make_remote is None:
            raise RuntimeError(f"{url}: no filesystem serves URLs in this process (call "
                               "picasso.connectors.beam_urls.serve_urls_through_beam for Beam's, or "
                               "picasso.storage.register_remote)")
        _remote = _make_remote()
    return _remote


def join(base: str | Path, *parts: str) -> str:
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *(part.strip("/") for part in parts)])
    return str(_local(base).joinpath(*parts))


def name(path: str | Path) -> str:
    """The last component: a file's or folder's own name."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def parent(path: str | Path) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[0] if is_url(path) else str(_local(path).parent)


def read_bytes(path: str | Path) -> bytes:
    return _backend(str(path)).read(str(path)) if is_url(path) else _local(path).read_bytes()


def open_read(path: str | Path) -> BinaryIO:
    """A seekable binary file to read (for files too big to read whole)."""
    return _backend(str(path)).open(str(path)) if is_url(path) else open(_local(path), "rb")


def read_text(path: str | Path) -> str:
    return read_bytes(path).decode()


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write the whole file at once: readers see the old contents or all of the new."""
    if is_url(path):
        _backend(str(path)).write(str(path), data)
        return
    target = _local(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode())


def exists(path: str | Path) -> bool:
    """A file, or a folder holding at least one file (a local folder: when it exists)."""
    if not is_url(path):
        return _local(path).exists()
    backend = _backend(str(path))
    return backend.exists(str(path)) or bool(backend.list(str(path).rstrip("/") + "/"))


def children(folder: str | Path) -> list[str]:
    """The names directly under folder (files and folders), sorted; [] when it is absent."""
    if not is_url(folder):
        local = _local(folder)
        return sorted(p.name for p in local.iterdir()) if local.is_dir() else []
    prefix = str(folder).rstrip("/") + "/"
    return sorted({url[len(prefix):].split("/", 1)[0] for url in _backend(prefix).list(prefix) if len(url) > len(prefix)})


def files_under(folder: str | Path) -> list[str]:
    """The paths of every file under folder, at any depth, sorted."""
    if not is_url(folder):
        local = _local(folder)
        return sorted(str(p) for p in local.rglob("*") if p.is_file()) if local.is_dir() else []
    return sorted(_backend(str(folder)).list(str(folder).rstrip("/") + "/"))


def delete(path: str | Path) -> None:
    """Remove one file (nothing when it is absent)."""
    if is_url(path):
        if _backend(str(path)).exists(str(path)):
            _backend(str(path)).delete([str(path)])
    else:
        _local(path).unlink(missing_ok=True)


def delete_tree(folder: str | Path) -> None:
    """Remove folder and everything under it (nothing when it is absent)."""
    if not is_url(folder):
        shutil.rmtree(_local(folder), ignore_errors=True)
        return
    urls = files_under(folder)
    if urls:
        _backend(str(folder)).delete(urls)


def copy_tree(source: str | Path, destination: str | Path) -> None:
    """Copy every file under source to the same place under destination: on a local disk
    as hard links where it can (no bytes move), between URLs by server-side copies."""
    if is_url(source) or is_url(destination):
        prefix = str(source).rstrip("/") + "/"
        sources = files_under(source)
        targets = [join(destination, path[len(prefix):] if is_url(source) else os.path.relpath(path, source))
                   for path in sources]
        if is_url(source) and is_url(destination):
            _backend(str(source)).copy(sources, targets)
        else:
            for path, target in zip(sources, targets):
                write_bytes(target, read_bytes(path))
        return
    for item in _local(source).rglob("*"):
        if item.is_file():
            target = _local(destination) / item.relative_to(_local(source))
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(item, target)
            except OSError:  # another filesystem
                shutil.copy2(item, target)


def append_line(path: str | Path, line: str) -> None:
    """Add one line to a log. Locally an append; on an object store, which cannot append,
    the log is rewritten whole (logs here are small and have one writer)."""
    if is_url(path):
        old = read_bytes(path) if exists(path) else b""
        write_bytes(path, old + line.encode() + b"\n")
        return
    local = _local(path)
    local.parent.mkdir(parents=True, exist_ok=True)
    with open(local, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_folder(folder: str | Path) -> str:
    """The folder as an absolute path (made, when local) or as its URL: on an object store a
    folder is only a prefix, made by its files."""
    if is_url(folder):
        return str(folder)
    local = _local(folder).resolve()
    local.mkdir(parents=True, exist_ok=True)
    return str(local)
