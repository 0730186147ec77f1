"""The parameter server's transport: gRPC, with its standard TLS and token credentials.

Why gRPC (grpcio, already installed with Beam, whose own control plane runs on it):
- membership is per call, not per group: a client connects, calls and goes at any time,
  and a server never waits on, or calls, a dead peer. torch.distributed.rpc's group is
  static, and its dynamic joins call every listed member, the dead ones included (seen
  with real processes), so a runner's restarted worker
  could never come back;
- it is maintained, takes TLS and per-call tokens through its standard credentials, has
  deadlines on every call and futures for calls left in flight;
- the payload stays our own (wire.py): no protobuf schema to generate, no pickle.
Its cost per pull and push against torch's RPC over TCP is measured by
`python -m benchmarks.ps_transport`: less per call, more per byte (grpcio copies a message
into its buffers and out again; TensorPipe sends tensor storage as it is).

Security:
- The server binds to loopback unless told another host. On loopback it may take a token
  (it checks it when it has one).
- On any other address it refuses to start without TLS (a certificate and its key) and a
  token: it would otherwise train on whatever anyone on the network pushed.
- Clients send the token as a bearer token: over TLS through grpc's
  access_token_call_credentials; on loopback, where grpc's call credentials need a secure
  channel, as the same `authorization` header in each call's metadata.
- A call without the right token is refused with UNAUTHENTICATED before it reaches a shard.

Methods are unary calls of bytes (wire.encode of the arguments tuple, wire.decode of the
answer) on the service `picasso.ParameterServer`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import hmac
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from picasso.distributed import wire

log = logging.getLogger(__name__)

SERVICE = "picasso.ParameterServer"
TOKEN_ENV = "PICASSO_PS_TOKEN"
# Messages are whole pulls and pushes: a big batch's rows are well past grpc's 4 MB default.
_MAX_MESSAGE = 1 << 30
_OPTIONS = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]


class TransportError(RuntimeError):
    """A call failed: the server is unreachable, refused the caller, or raised."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.code = code

    @property
    def unreachable(self) -> bool:
        """The server could not be reached, or went away before it answered."""
        return self.code == grpc.StatusCode.UNAVAILABLE


@dataclass(frozen=True)
class Security:
    """What a server requires, or a client presents. Paths are PEM files."""

    token: str | None = None  # shared secret; default: $PICASSO_PS_TOKEN
    tls_cert: str | None = None  # server: its certificate; client: the CA (or the certificate) to trust
    tls_key: str | None = None  # server only: the certificate's private key
    # client: the name the server's certificate carries, when it is not the host dialled
    tls_server_name: str | None = None

    @classmethod
    def from_env(cls, **given) -> "Security":
        given = {key: value for key, value in given.items() if value is not None}
        return cls(**{"token": os.environ.get(TOKEN_ENV) or None, **given})

    def with_env_token(self) -> "Security":
        """These settings, with $PICASSO_PS_TOKEN as the token when they carry none: read
        where the call is made (a Beam worker), so the secret never travels in a pipeline."""
        return self if self.token else dataclasses.replace(self, token=os.environ.get(TOKEN_ENV) or None)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


@functools.cache
def keep_message_memory() -> None:
    """Let glibc keep freed message buffers for the next message instead of handing them
    back to the kernel. Every pull and push allocates buffers of megabytes (the message,
    grpc's copy of it, the receiver's); with glibc's defaults each one is a fresh mmap whose
    pages fault in on first touch, which costs several times the transfer itself
    (benchmarks.ps_transport shows it). Process-wide, so it is called by the
    processes that serve or join a job (once), not on import. Elsewhere than glibc: nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's ceiling for it on 64-bit
        libc.mallopt(m_trim_threshold, 512 << 20)
    except (OSError, AttributeError):  # not glibc
        log.debug("mallopt unavailable; message buffers use the allocator's defaults")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A port nothing listens on now (for a server this process is about to start), nor on
    the count - 1 ports after it: a job of S shards listens on port, port + 1, ... port +
    S - 1, and a port the system hands out says nothing of its neighbours."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port + count <= 65536 and all(_bindable(host, port + i) for i in range(1, count)):
            return port
    raise OSError(f"no {count} free ports in a row on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"cannot read the {what} {path}: {err.strerror}") from None


# -- the server ---------------------------------------------------------------------------------

class _TokenCheck(grpc.ServerInterceptor):
    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, details):
        presented = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(presented.encode(), self._expected):
            return continuation(details)
        return _refusal


def _refuse(request, context):
    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                  f"no valid token: this parameter server takes calls with its shared token (${TOKEN_ENV})")


_refusal = grpc.unary_unary_rpc_method_handler(_refuse)


def serve(methods: dict[str, Callable], host: str, port: int, security: Security, threads: int) -> grpc.Server:
    """Start a server of `methods` (name -> fn(*args)) on host:port; returns it started.
    An exception a method raises reaches the caller as its message (FAILED_PRECONDITION)."""
    if not is_loopback(host) and (not security.tls or not security.token):
        raise ValueError(f"a parameter server on {host} (not loopback) needs TLS (--tls-cert and --tls-key) and a "
                         f"token (${TOKEN_ENV}): without them anyone on the network could push gradients")
    if security.tls and not security.tls_key:
        raise ValueError("TLS needs the certificate's private key too (--tls-key)")
    keep_message_memory()
    handlers = {name: grpc.unary_unary_rpc_method_handler(_handler(name, fn)) for name, fn in methods.items()}
    interceptors = [_TokenCheck(security.token)] if security.token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ps"),
                         interceptors=interceptors, options=_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    address = f"{host}:{port}"
    if security.tls:
        credentials = grpc.ssl_server_credentials([(_read(security.tls_key, "TLS key"),
                                                    _read(security.tls_cert, "TLS certificate"))])
        bound = server.add_secure_port(address, credentials)
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {address} (in use?)")
    server.start()
    return server


def _handler(name: str, fn: Callable):
    def handle(request: bytes, context):
        try:
            args = wire.decode(request)
        except wire.WireError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {err}")
        try:
            return wire.encode(fn(*args))
        except Exception as err:  # a refusal or a bug over here: the caller is told which
            log.debug("%s failed", name, exc_info=True)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{name}: {type(err).__name__}: {err}")

    return handle


# -- the client ---------------------------------------------------------------------------------

class Call:
    """A call in flight: done() and result(), like a future."""

    def __init__(self, future: grpc.Future, describe: Callable[[grpc.RpcError], TransportError]):
        self._future, self._describe = future, describe

    def done(self) -> bool:
        return self._future.done()

    def result(self):
        try:
            return wire.decode(self._future.result())
        except grpc.RpcError as err:
            raise self._describe(err) from None


class Connection:
    """A channel to one server. Thread-safe: calls from many threads share it."""

    def __init__(self, host: str, port: int, security: Security, timeout_s: float, name: str = "server"):
        self.address, self.name, self.timeout_s = f"{host}:{port}", name, timeout_s
        keep_message_memory()
        options = list(_OPTIONS)
        if security.tls:
            if security.tls_server_name:
                options.append(("grpc.ssl_target_name_override", security.tls_server_name))
            credentials = grpc.ssl_channel_credentials(root_certificates=_read(security.tls_cert, "TLS certificate"))
            if security.token:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.access_token_call_credentials(security.token))
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
            self._metadata = None
        else:
            self._channel = grpc.insecure_channel(self.address, options=options)
            self._metadata = (("authorization", f"Bearer {security.token}"),) if security.token else None
        self._methods: dict[str, grpc.UnaryUnaryMultiCallable] = {}

    def _method(self, name: str) -> grpc.UnaryUnaryMultiCallable:
        method = self._methods.get(name)
        if method is None:
            method = self._methods[name] = self._channel.unary_unary(f"/{SERVICE}/{name}")
        return method

    def call(self, name: str, *args, timeout_s: float | None = None):
        try:
            return wire.decode(self._method(name)(wire.encode(args), timeout=timeout_s or self.timeout_s,
                                                  metadata=self._metadata))
        except grpc.RpcError as err:
            raise self._error(name, err) from None

    def call_async(self, name: str, *args, wait_for_ready: bool = False) -> Call:
        """wait_for_ready: a server that cannot be reached now is waited for, up to the
        call's timeout, instead of failing the call at once."""
        future = self._method(name).future(wire.encode(args), timeout=self.timeout_s, metadata=self._metadata,
                                           wait_for_ready=wait_for_ready)
        return Call(future, lambda err: self._error(name, err))

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the server accepts connections (within timeout_s)."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
            return True
        except grpc.FutureTimeoutError:
            return False

    def close(self) -> None:
        self._channel.close()

    def _error(self, name: str, err: grpc.RpcError) -> TransportError:
        code = err.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            detail = f"is unreachable ({err.details()})"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            detail = f"did not answer within {self.timeout_s:g} s"
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            detail = f"refused the caller: {err.details()}"
        else:
            detail = f"failed: {err.details()}"
        return TransportError(f"{self.name} at {self.address} {detail} (call {name})", code)
