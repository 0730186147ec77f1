"""TrainConfig: a training run's settings, the same in every mode (local, sync, GBA).

Torch-free to import, so that the command line takes its defaults for its flags without
loading torch (`picasso --help`). Making one asks torch for the device where the precision
is `auto` (decided then, so that the config, its checkpoints and its versions name the
precision the model trained in), and what it builds (the model, the optimizers) import
their torch modules where they are built. picasso.trainer re-exports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from picasso.precision import check_precision, choose_precision

if TYPE_CHECKING:
    import torch

    from picasso.cache import CacheConfig
    from picasso.dense_adam import DenseAdam
    from picasso.kernels import SparseOptimizer
    from picasso.packing import PackingPlan
    from picasso.spec import FeatureSpec


@dataclass(frozen=True)
class TrainConfig:
    model: str = "wide_deep"
    hidden: tuple[int, ...] = (256, 128)
    lr_dense: float = 1e-3  # Adam
    lr_sparse: float = 0.05  # the sparse optimizer's, on embedding rows
    # adagrad (row-wise), adagrad_elementwise (torch.optim.Adagrad's), adam (lazy) or sgd;
    # fields may override
    sparse_optimizer: str = "adagrad"
    seed: int = 0
    log_every: int = 100  # steps between progress lines
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu
    # torch.compile the dense part (interaction + MLP). Off by default: on CPU it saved
    # 1-11% of the dense part's step (benchmarks.dense_compile) for 8-28 s of compiling.
    compile_dense: bool = False
    cache: CacheConfig | None = None  # the hot-row cache; None: lookups read the tables directly
    # Prepare batch i+1 while batch i computes. None: where it pays (interleave.worth_interleaving:
    # with a GPU, or CPU cores that torch's threads leave free).
    interleave: bool | None = None
    # What a step's summed log loss is divided by: the batch size the run is configured
    # with (every command sets it from its --batch-size), so that every sample weighs the
    # same whether its batch is full, short or oversized. A batch's plain mean would weigh
    # each sample of a short batch (a small day, a file's last chunk, a stream's small poll,
    # the rows a holdout leaves) by one over its size: on MovieLens' days of 36 to 3,550
    # rows, up to 57 times a full batch's (benchmarks.movielens). It is a setting, not state:
    # a warm start with another --batch-size weighs each sample by one over the new size, as
    # its batch mean would, and no batch changes how later ones weigh. Adam and Adagrad are
    # blind to one scale for every step: a run of full batches steps exactly as with the
    # batch mean. None: each batch's own mean (a library caller that cuts its own batches).
    loss_batch_size: int | None = None
    # Regularisation, all off by default (benchmarks.movielens found none that helped at the
    # default learning rates; larger models on fewer rows may want them):
    weight_decay: float = 0.0  # L2 on the dense weights: Adam's, added to their gradients
    # L2 on embedding rows: added to a row's gradient in the fused update, on the rows each
    # step touches (FBGEMM's and TensorFlow's sparse L2): a row decays as often as it is seen.
    embedding_l2: float = 0.0
    dropout: float = 0.0  # the probability of zeroing each hidden activation of the MLPs while training
    # The dense part's arithmetic: fp32, or bf16 (autocast; weights and optimizer state stay
    # fp32). The embeddings are fp32 either way. auto: bf16 where the device runs it
    # natively, else fp32 (picasso.precision), decided when the config is made, so that the
    # config, its checkpoints and its versions name the precision the model trained in.
    precision: str = "auto"

    def __post_init__(self):
        size = self.loss_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise ValueError(f"loss_batch_size must be a positive integer (samples) or None, got {size!r}")
        for name in ("weight_decay", "embedding_l2", "dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.dropout >= 1:
            raise ValueError(f"dropout must be below 1, got {self.dropout!r}")
        if self.precision == "auto":
            object.__setattr__(self, "precision", choose_precision("auto", self.model, *self._device_bf16()))
        check_precision(self.precision)

    def _device_bf16(self) -> tuple[str, bool]:
        """The device type these settings train on, and whether it is a GPU with bf16."""
        import torch  # asked only where a config is made: the command line's flags need none

        device = resolve_device(self.device)
        return device.type, device.type == "cuda" and torch.cuda.is_bf16_supported()

    def build_model(self, spec: FeatureSpec, plan: PackingPlan):
        """The model these settings describe, untrained: the Trainer's, a sync rank's or a
        GBA worker's (so every mode gets every setting, dropout included)."""
        from picasso.models import build_model  # torch: see the module docstring

        return build_model(self.model, spec, plan, self.hidden, self.dropout, self.precision)

    def sparse_optimizer_settings(self) -> SparseOptimizer:
        """The default optimizer of the embedding tables (fields may name another kind)."""
        from picasso.kernels import SparseOptimizer  # torch: see the module docstring

        return SparseOptimizer(self.sparse_optimizer, lr=self.lr_sparse, weight_decay=self.embedding_l2)

    def dense_optimizer_for(self, params) -> DenseAdam:
        """The dense part's optimizer: every mode steps the dense weights with this one."""
        from picasso.dense_adam import DenseAdam  # torch: see the module docstring

        return DenseAdam(params, lr=self.lr_dense, weight_decay=self.weight_decay)


def resolve_device(name: str) -> torch.device:
    """The device a config's `device` names: auto is cuda where torch sees a GPU, else cpu."""
    import torch  # see _device_bf16

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
