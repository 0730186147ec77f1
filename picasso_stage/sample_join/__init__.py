"""The sample join: impressions paired with their delayed labels into training samples.

- join_state.py: JoinState, the join policy as one deterministic function over columns
  (the policy itself is its docstring);
- join_rules.py: the policy's rules and contract types, pure functions over numpy arrays
  that both hosts of the join share (JoinState, and Beam's keyed state:
  pipelines/transforms/join_labels.py); its JoinPolicy and LATE_LABEL_POLICIES live in
  join_policy.py, free of numpy and torch, for the command line;
- join_spec.py: the spec's `join:` section (keys, event time, wait, late labels);
- held_features.py and feature_arrays.py: the feature records a join holds until its
  samples leave, as numpy arrays by record slot;
- sample_buffer.py: joined samples mixed over a window before they become batches;
- delayed_feedback.py: the loss weights of a stream that corrects late labels;
- reference.py: the same policy one event at a time over dicts (what tests hold JoinState
  to), and dict_join.py, that reference as a careful user would write it (benchmarks.join's
  baseline).

Nothing is imported here: each caller imports the module it needs.
"""
