"""Distributed update modes: GBA over a parameter server, plain async, (later) sync.

Kept apart the way TorchRec keeps math from distribution:
- staleness.py:   how much a stale gradient still counts (the decay function);
- aggregation.py: gradients of local batches summed into one global batch (pure math);
- gba.py:         token control: the global step, workers' tokens, when to step;
- layout.py:      which shard holds which parameter and which embedding rows, and the
                  split/merge between a Trainer's state and the shards' states;
- shard.py:       one shard's parameters and optimizers, stepped by a global batch;
- param_server.py: the shards served over torch.distributed.rpc, and the client.
"""
