"""Distributed update modes: sync all-reduce, GBA over a parameter server, plain async.

Kept apart the way TorchRec keeps math from distribution:
- staleness.py:      how much a stale gradient still counts (the decay function);
- aggregation.py:    local-batch gradients summed into one global batch (pure math);
- gba.py:            token control: the global step, workers' tokens, when to step, who is dropped;
- layout.py:         which shard holds which parameter and which embedding rows, and the
                     split/merge between a Trainer's state and the shards';
- shard.py:          one shard's parameters and optimizers, stepped by a global batch;
- ps_checkpoint.py:  shards from a Trainer's state, and a Trainer checkpoint from the shards;
- local_gradient.py: a worker's gradients of one batch against pulled rows;
- applied_ranges.py: the source ranges a shard has trained: what makes pushes idempotent;
- wire.py:           the messages as bytes (tensors and registered dataclasses, no pickle);
- transport.py:      gRPC: serving methods, connections, TLS and the token;
- param_server.py:   the shards served over transport.py, and membership by lease;
- ps_client.py:      the worker's client: requests split by owning shard, pushes in flight;
- worker_startup.py: joining a running job as a worker: the one way in, for the CLI and Beam;
- worker.py:         the GBA / async worker loop;
- sync.py:           sync mode under torchrun: dense gradients all-reduced, row gradients gathered as flat tensors, GBA's step applied once per rank.

Every mode computes local gradients the same way and steps through the same Shard, so
the learning rate, optimizers and global batch mean the same thing in each, and every
mode reads and writes the Trainer's checkpoint layout: a job switches mode by restarting
from a checkpoint with a different mode and nothing else. The commands `ps`, `gba-worker`
and `sync-worker` run picasso.pipelines.runs' param_server.py, gba_worker.py and
sync_worker.py; picasso.pipelines.cli.distributed parses their flags.
"""
