"""The runs picasso's commands start: daily (one partition, or a range of them), stream (with
its checkpointed state), produce and generate, each over one work folder
(workdir.py); and the distributed modes' runs: the parameter server (param_server.py), a
GBA worker (gba_worker.py) and a sync rank (sync_worker.py), sharing distributed_job.py."""
