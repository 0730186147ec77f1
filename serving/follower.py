"""What `picasso serve` serves, and how it follows a registered model's alias.

`models:/NAME@ALIAS` is looked up every poll_s seconds; when the alias points at another
version (a new champion, or a rollback), that version loads in this thread while the one
being served keeps answering, and then replaces it in one assignment. A request takes the
served version once, when it starts, so it finishes on the model it started on and never
sees one half loaded. Any other model URI (`models:/NAME/N`, `runs:/...`, a folder) is
pinned: loaded once, never polled.

A version that fails to load (VersionFailure) leaves the served one in place; it is logged
once per version and kind, counted, and shown by /health. Only the registry being
unreachable is tried again at later polls: a broken artifact or another request contract
stays broken until the alias moves on.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from mlflow.tracking import MlflowClient

from picasso.serving.publishing.registry import NO_SUCH_VERSION, version_by_alias
from picasso.serving.versions import REGISTRY, LoadedVersion, VersionFailure, VersionLoader, describe, is_unreachable

log = logging.getLogger("picasso.serve")

_ALIAS_URI = re.compile(r"^models:/(?P<name>[^/@]+)@(?P<alias>[^/@]+)/?$")
LOADER_NICE = 19
RECENT_SWAPS = 20  # loads /health lists
_VERSION_URI = re.compile(r"^models:/(?P<name>[^/@]+)/(?P<version>\d+)/?$")


@dataclass(frozen=True)
class ModelRef:
    """A --model URI, read: a registered model's alias (followed) or anything pinned."""

    uri: str
    name: str | None = None
    alias: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, uri: str) -> "ModelRef":
        if match := _ALIAS_URI.match(uri):
            return cls(uri, name=match["name"], alias=match["alias"])
        if match := _VERSION_URI.match(uri):
            return cls(uri, name=match["name"], version=match["version"])
        if uri.startswith("models:/"):
            raise ValueError(f"--model {uri}: give models:/NAME@ALIAS (followed) or models:/NAME/VERSION (pinned)")
        return cls(uri)

    @property
    def follows(self) -> bool:
        return self.alias is not None


@dataclass
class SwapRecord:
    """What the follower has done, for /health, /version and the metrics."""

    swaps: dict[str, int] = field(default_factory=dict)  # by FULL / DELTA
    failures: dict[str, int] = field(default_factory=dict)  # by VersionFailure.kind
    failed: dict[str, VersionFailure] = field(default_factory=dict)  # by version: the last failure
    registry_error: str | None = None  # the last poll's, while the registry is unreachable
    last_poll: float | None = None  # time.time() of the last poll that reached the registry
    wanted: str | None = None  # the version the alias points at
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_SWAPS))  # describe() of the last loads


class Follower:
    """Holds the served LoadedVersion and, for an alias, a thread that follows it."""

    def __init__(self, ref: ModelRef, client: MlflowClient, loader: VersionLoader, poll_s: float = 2.0,
                 on_swap=None):
        self.ref = ref
        self.client = client
        self.loader = loader
        self.poll_s = poll_s
        self.record = SwapRecord()
        self.served: LoadedVersion | None = None
        self._on_swap = on_swap or (lambda old, new: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- start -------------------------------------------------------------------------

    def load_first(self, timeout_s: float, say=print) -> LoadedVersion:
        """The first version, before the port opens. Waits, with a line a try, while the
        registry is unreachable or the alias points nowhere; raises VersionFailure for a
        version that cannot load, and TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._poll_once(raise_failures=True)
                if self.served is not None:
                    return self.served
                problem = f"{self.ref.uri} points at no version yet"
            except VersionFailure as failure:
                if failure.kind != REGISTRY:
                    raise
                problem = str(failure)
            if time.monotonic() + self.poll_s > deadline:
                raise TimeoutError(f"no model to serve after {timeout_s:.0f} s: {problem}")
            say(f"picasso serve: waiting for {self.ref.uri}: {problem}; trying again in {self.poll_s:g} s")
            time.sleep(self.poll_s)

    def start(self) -> None:
        if self.ref.follows:
            self._thread = threading.Thread(target=self._follow, name="picasso-serve-follower", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- following -----------------------------------------------------------------------

    def _follow(self) -> None:
        # Loading a version is background work: at the lowest CPU priority this thread can
        # have (Linux: a thread's own nice value), requests being answered come first.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOADER_NICE)
        except (AttributeError, OSError):  # not Linux, or not allowed
            pass
        said = None
        while not self._stop.wait(self.poll_s):
            try:
                self._poll_once()
                said = None
            except Exception as err:  # noqa: BLE001 - the follower must outlive anything one poll meets
                line = f"picasso serve: a look at {self.ref.uri} failed: {type(err).__name__}: {err}"
                if line != said:  # once, not once a poll
                    log.warning("%s; still serving version %s", line, self.served.version if self.served else "none")
                said = line

    def _poll_once(self, raise_failures: bool = False) -> None:
        wanted = self._wanted_version(raise_failures)
        if wanted is None:
            return
        number = str(wanted.version) if wanted is not True else ""
        if self.served is not None and self.served.version == number:
            return
        known = self.record.failed.get(number)
        if known is not None and known.kind != REGISTRY and not raise_failures:
            return  # logged once already; waits for the alias to move on
        try:
            loaded = self.loader.load_uri(self.ref.uri) if wanted is True else \
                self.loader.load_version(self.ref.name, wanted, self.served)
        except VersionFailure as failure:
            self._failed(failure)
            if raise_failures:
                raise
            return
        self._swap(loaded)

    def _wanted_version(self, raise_failures: bool):
        """The version entity to serve, True for a pinned non-registry URI, or None (the
        alias points nowhere, or the registry could not be asked)."""
        if not self.ref.name:
            return True if self.served is None else None
        try:
            if self.ref.follows:
                found = version_by_alias(self.client, self.ref.name, self.ref.alias,
                                         absent=NO_SUCH_VERSION)
            else:
                found = None if self.served is not None else self.client.get_model_version(self.ref.name,
                                                                                            self.ref.version)
        except Exception as err:  # noqa: BLE001
            if not is_unreachable(err):
                raise
            failure = VersionFailure(self.record.wanted or "?", REGISTRY, f"the registry is unreachable: {err}")
            if self.record.registry_error is None:
                log.warning("picasso serve: %s; still serving version %s", failure.reason,
                            self.served.version if self.served else "none")
            self.record.registry_error = failure.reason
            if raise_failures:
                raise failure from err
            return None
        if self.record.registry_error is not None:
            log.warning("picasso serve: the registry answers again")
        self.record.registry_error = None
        self.record.last_poll = time.time()
        if found is not None:
            self.record.wanted = str(found.version)
        return found

    def _failed(self, failure: VersionFailure) -> None:
        first = self.record.failed.get(failure.version)
        self.record.failed[failure.version] = failure
        self.record.failures[failure.kind] = self.record.failures.get(failure.kind, 0) + 1
        if first is None or first.kind != failure.kind:
            log.warning("picasso serve: %s; still serving version %s", failure,
                        self.served.version if self.served else "none")

    def _swap(self, loaded: LoadedVersion) -> None:
        old, self.served = self.served, loaded  # one assignment: a request sees the old or the new
        self.record.swaps[loaded.loaded_by] = self.record.swaps.get(loaded.loaded_by, 0) + 1
        self.record.recent.append({**describe(loaded), "swapped_at": time.time()})
        self.record.failed.pop(loaded.version, None)
        if old is not None:
            # Its files only: a request that took it still holds the model, loaded in memory.
            self.loader.forget(old)
        self._on_swap(old, loaded)

    # -- what /health says -----------------------------------------------------------------

    def health(self) -> tuple[bool, dict]:
        """(healthy, what /health answers): healthy while the served version is the one
        the alias points at and the registry answers."""
        served = self.served
        failure = self.record.failed.get(self.record.wanted or "")
        healthy = served is not None and failure is None and self.record.registry_error is None
        return healthy, {
            "status": "ok" if healthy else "degraded",
            "model": self.ref.uri,
            "served_version": served.version if served else None,
            "wanted_version": self.record.wanted,
            "registry_error": self.record.registry_error,
            "failed_versions": {version: {"kind": f.kind, "reason": f.reason} for version, f in self.record.failed.items()},
            "last_poll_age_s": None if self.record.last_poll is None else round(time.time() - self.record.last_poll, 3),
            "recent_swaps": list(self.record.recent),
        }
