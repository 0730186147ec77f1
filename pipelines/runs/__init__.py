"""The runs picasso's commands start: daily (one partition, or a range of them), stream (with
its checkpointed state), produce, generate and planted data, each over one work folder
(workdir.py)."""
