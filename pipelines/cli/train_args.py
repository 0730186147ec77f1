"""Command-line options of the model and its training, shared by `daily`, `demo`, `stream`
and the distributed commands, so that every mode takes the same flags with the same
defaults (switching modes needs no retuning)."""

from __future__ import annotations

import argparse
import math
from dataclasses import fields

# Torch-free, all of them: the flags (and every --help) are built without torch.
from picasso.precision import PRECISIONS
from picasso.train_choices import MODEL_NAMES, ROW_GRADIENTS, SPARSE_OPTIMIZERS
from picasso.train_config import TrainConfig

# The TrainConfig fields these options set (argparse dests), for commands that pass them on
# to processes of their own (the parameter server's shards).
MODEL_FLAGS = ("model", "hidden", "lr_dense", "lr_sparse", "sparse_optimizer", "weight_decay", "embedding_l2", "dropout",
              "precision")


def _non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _probability(text: str) -> float:
    value = _non_negative(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1, got {text!r}")
    return value


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(size) for size in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"must be positive layer sizes, comma-separated (256,128), got {text!r}")
    return sizes


def add_model_args(parser: argparse.ArgumentParser) -> None:
    # The defaults without a TrainConfig, whose making asks torch for the device (precision auto).
    defaults = argparse.Namespace(**{field.name: field.default for field in fields(TrainConfig)})
    group = parser.add_argument_group("model and training")
    group.add_argument("--model", choices=MODEL_NAMES, default=defaults.model)
    group.add_argument("--hidden", type=_hidden, default=defaults.hidden, help="MLP sizes, comma-separated (256,128)")
    group.add_argument("--lr-dense", type=_non_negative, default=defaults.lr_dense, help="Adam's, on the dense part")
    group.add_argument("--lr-sparse", type=_non_negative, default=defaults.lr_sparse,
                       help="the sparse optimizer's, on embedding rows")
    group.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default=defaults.sparse_optimizer,
                       help="default optimizer of the embedding tables (fields may name their own)")
    group.add_argument("--precision", choices=PRECISIONS, default="auto",
                       help="the dense part's arithmetic: bf16 runs the MLPs and interactions under autocast, "
                            "with fp32 weights and optimizer state (the embeddings stay fp32); auto (the "
                            "default): bf16 where the CPU (avx512_bf16, AMX) or GPU has it natively, else fp32; "
                            "the log says which it took")
    regularisation = parser.add_argument_group("regularisation (all off by default)")
    regularisation.add_argument("--weight-decay", type=_non_negative, default=defaults.weight_decay,
                                help="L2 on the dense weights (Adam's weight decay)")
    regularisation.add_argument("--embedding-l2", type=_non_negative, default=defaults.embedding_l2,
                                help="L2 on embedding rows, applied to the rows each step touches")
    regularisation.add_argument("--dropout", type=_probability, default=defaults.dropout,
                                help="dropout on the MLPs' hidden activations while training")


def add_row_gradient_arg(parser) -> None:
    """How GBA and sync average a row's gradient: the same flag, and default, in both."""
    parser.add_argument("--row-gradient", choices=ROW_GRADIENTS, default=ROW_GRADIENTS[0],
                        help="global-mean (default): a row's summed gradient over the global batch's size, as one "
                             "big batch would step it; touched-mean: over the sizes of only the local batches that "
                             "held its id (a rare id then steps up to M times harder)")


def model_settings(args: argparse.Namespace) -> dict:
    """The TrainConfig fields the options set, as keyword arguments."""
    return {flag: getattr(args, flag) for flag in MODEL_FLAGS}


def flag_value(flag: str, value) -> str:
    """A model option's value as its flag takes it on a command line."""
    return ",".join(map(str, value)) if flag == "hidden" else str(value)
