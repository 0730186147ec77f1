"""Serving: what a published version is (the MLflow pyfunc, its request rows, its weights
and signature) and `picasso serve`, the server that follows a registered model's alias
and swaps to each new version, by delta where it can, while it keeps answering.

- pyfunc_model.py: the logged model (raw feature columns in, a probability per row out);
- request_decoding.py: a request's rows decoded, with each bad row's reason;
- weights.py: the serving weights (what the pyfunc loads, hashes and deltas are of);
- signature.py: the input signature the version is logged with;
- model_code.py, code_closure.py: the code a version ships, exactly the picasso modules
  the pyfunc needs (read from their files) and the kernels' C++ sources, and its pinned
  pip requirements; none of training's outside systems, publishing or the server;
- versions.py, follower.py, server.py, server_metrics.py: `picasso serve`; old_names.py
  keeps the module names that versions logged earlier import;
- publishing/: publishing checkpoints as registered versions.
"""
