"""A spec reference resolved: a FeatureSpec, a built-in name (builtin_specs), or a YAML file
(local or a URL: picasso.storage). Apart from spec.py, which builtin_specs builds on."""

from __future__ import annotations

from pathlib import Path

import yaml

from picasso import storage
from picasso.builtin_specs import builtin_spec
from picasso.sample_join.join_spec import JoinSpec, parse_join
from picasso.spec import FeatureSpec, SpecError, parse_spec


def load_join_spec(ref: str | Path | FeatureSpec) -> JoinSpec:
    """The join section of a spec file; the defaults for a built-in spec or one without."""
    if isinstance(ref, FeatureSpec) or not storage.exists(str(ref)):
        load_spec(ref)  # a built-in, or the same error load_spec gives
        return JoinSpec()
    load_spec(ref)  # raises SpecError naming every problem, the join section's included
    return parse_join(yaml.safe_load(storage.read_text(str(ref))).get("join"), [])


def load_spec(ref: str | Path | FeatureSpec) -> FeatureSpec:
    """Resolve a spec reference: a FeatureSpec, a built-in name, or a YAML file.

    Built-ins: ``criteo`` (13 dense, 26 sparse fields), ``criteo:N`` (the same dense
    fields with N sparse fields of mixed dims, some multi-hot) and ``churn`` (the churn
    data set's, with a dynamic item table; ``churn:hashed`` the same with a fixed one):
    see builtin_specs.
    """
    if isinstance(ref, FeatureSpec):
        return ref
    text = str(ref)
    builtin = builtin_spec(text)
    if builtin is not None:
        return builtin
    if not storage.exists(text):
        raise SpecError([f"spec '{text}': no such file, and not a built-in (criteo, criteo:N, churn, churn:hashed)"])
    try:
        raw = yaml.safe_load(storage.read_text(text))
    except yaml.YAMLError as err:
        raise SpecError([f"spec '{text}': not valid YAML: {err}"]) from err
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError([f"spec '{text}': cannot be read: {err}"]) from err
    return parse_spec(raw)
