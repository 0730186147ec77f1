"""Models built from a FeatureSpec on top of PackedEmbedding."""

from __future__ import annotations

from torch import nn

from picasso.dynamic_rows import DynamicRows
from picasso.models.common import MLP
from picasso.precision import DENSE_PRECISIONS, check_precision
from picasso.models.dcn_v2 import DCNv2
from picasso.models.deepfm import DeepFM
from picasso.models.dlrm import DLRM
from picasso.models.wide_deep import WideDeep
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec

MODELS = {"wide_deep": WideDeep, "deepfm": DeepFM, "dlrm": DLRM, "dcn_v2": DCNv2}


def build_model(name: str, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...],
                dropout: float = 0.0, precision: str = "fp32") -> nn.Module:
    """dropout: the probability of zeroing each hidden activation of every MLP in the
    model while it trains (0: none); precision: the dense part's, fp32 or bf16 (picasso.precision)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
    check_precision(precision, DENSE_PRECISIONS)
    wide_only = [f.name for f in spec.crosses if f.part == "wide"]
    if wide_only and not MODELS[name].wide_part:
        raise ValueError(f"model {name!r} has no wide part, which cross(es) {', '.join(wide_only)} feed alone: give "
                         f"them `part: deep` or `part: both` in the spec, or choose a model with one "
                         f"({', '.join(sorted(n for n, m in MODELS.items() if m.wide_part))})")
    model = MODELS[name](spec, plan, hidden)
    model.precision = precision
    if spec.dynamic_fields:  # the id -> row maps, model state like the tables they index
        model.dynamic_rows = DynamicRows(spec, plan)
    for module in model.modules():
        if isinstance(module, MLP):
            module.dropout = float(dropout)
    return model
