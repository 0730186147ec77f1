"""--spec, the same flag with the same help on every command that takes a spec."""

from __future__ import annotations

import argparse

SPEC_HELP = ("the feature spec: a built-in name (criteo; criteo:N, N sparse fields; churn; churn:hashed) or a YAML "
             "file, a path or a URL (see picasso.spec_refs)")


def add_spec_arg(parser: argparse.ArgumentParser, default: str | None = None, required: bool = False,
                 also: str = "") -> None:
    """also: what this command adds to the help (a default that depends on another flag)."""
    shown = f" (default: {default})" if default and not also else ""
    parser.add_argument("--spec", default=default, required=required, metavar="SPEC",
                        help=f"{SPEC_HELP}{shown}{also}")
