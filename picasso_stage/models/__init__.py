"""Models built from a FeatureSpec on top of PackedEmbedding."""

from __future__ import annotations

from torch import nn

from picasso.models.dcn_v2 import DCNv2
from picasso.models.deepfm import DeepFM
from picasso.models.dlrm import DLRM
from picasso.models.wide_deep import WideDeep
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec

MODELS = {"wide_deep": WideDeep, "deepfm": DeepFM, "dlrm": DLRM, "dcn_v2": DCNv2}


def build_model(name: str, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...]) -> nn.Module:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](spec, plan, hidden)
