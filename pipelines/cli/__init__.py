"""The `picasso` command line (main.py) and the flags its commands share.

Kept empty: picasso.pipelines imports cli.process_exit first thing, before anything heavy
is loaded."""
