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
- param_server.py:   the shards served over torch.distributed.rpc, and the worker's client;
- worker.py:         the GBA / async worker loop;
- sync.py:           sync mode under torchrun: all-gathered local gradients, GBA's step.

Every mode computes local gradients the same way and steps through the same Shard, so
the learning rate, optimizers and global batch mean the same thing in each, and every
mode reads and writes the Trainer's checkpoint layout: a job switches mode by restarting
from a checkpoint with a different mode and nothing else. The commands are in
picasso.pipelines.distributed_cli (`ps`, `gba-worker`, `sync-worker`).
"""
