"""Generated data, for the embedded defaults, the tests and the benchmarks: no public CTR
data set of useful size can be had offline.

- planted.py: rows in a spec's schema with labels from a planted ground-truth model (a
  known AUC ceiling);
- churn.py: a planted model whose items are born and fade (what dynamic tables are for);
- events.py: the planted rows as an impression stream and a delayed click stream (what
  the sample join pairs up), timed as event_config.py's EventStreamConfig says (its own
  module, numpy- and torch-free, for the command line);
- planted_batches.py: planted rows decoded and packed as the pipelines would, each batch
  with its position (what the distributed commands and their tests train on).

Nothing is imported here: each caller imports the module it needs.
"""
