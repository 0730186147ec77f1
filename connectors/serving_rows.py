"""Moved to picasso.serving.rows. Kept for the versions logged before: their
pyfunc_model.py imports it from here, and a server whose picasso is already imported
(`picasso serve`) resolves that import against the installed picasso."""

from picasso.serving.rows import BadRows, decode_request, on_bad_row_problem  # noqa: F401
