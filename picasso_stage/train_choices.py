"""The names a training run's settings choose among, torch-free: the command line offers
them (argparse's choices, in its --help too) without importing torch, which the modules
they name need (DESIGN.md; `picasso --help` and `--version` import neither).

- MODEL_NAMES: the models picasso.models.MODELS builds, sorted (a test keeps the two the same);
- SPARSE_OPTIMIZERS: the embedding tables' optimizers, a run's default or a spec field's (spec.py);
- ROW_GRADIENTS: how GBA and sync divide a row's summed gradient (distributed/aggregation.py).

The dense part's precisions are picasso.precision's, torch-free too.
"""

from __future__ import annotations

MODEL_NAMES = ("dcn_v2", "deepfm", "dlrm", "wide_deep")
SPARSE_OPTIMIZERS = ("sgd", "adagrad", "adagrad_elementwise", "adam")
# How a row's summed gradient is divided (aggregation.py's docstring): by the global batch's
# size (one big batch: sync's meaning), or by the sizes of the batches that touched it.
ROW_GRADIENTS = ("global-mean", "touched-mean")
