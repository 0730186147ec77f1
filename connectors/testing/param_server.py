"""Every parameter-server shard in this process: a `call` for PSClient that reaches Shard
objects directly instead of over gRPC, so tests and one-process benchmarks run the same
client as a real job."""

from __future__ import annotations

from picasso.distributed.shard import Shard


class _Answered:
    """An in-process call's answer, shaped like a call in flight."""

    def __init__(self, value):
        self.value = value

    def done(self) -> bool:
        return True

    def result(self):
        return self.value


def in_process(shards: list[Shard]):
    """A `call` for PSClient that reaches Shard objects in this process instead of over
    the network: the same client, for tests and one-process runs."""
    methods = {"pull": "pull", "resolve": "resolve", "push": "push", "positions": "positions", "forget": "drop_worker",
               "finish": "retire", "held": "held", "settle": "settle", "pass_over": "pass_over",
               "renew": "renew"}

    def call(index: int, method: str, args: tuple, asynchronous: bool):
        result = getattr(shards[index], methods[method])(*args)
        return _Answered(result) if asynchronous else result

    return call
