"""Moved to picasso.serving.weights. Kept for the versions logged before: their
pyfunc_model.py imports it from here, and a server whose picasso is already imported
(`picasso serve`) resolves that import against the installed picasso."""

from picasso.serving.weights import is_training_only  # noqa: F401
