"""`python -m picasso.pipelines.cli COMMAND ...`: the `picasso` console script."""

from picasso.pipelines.cli.main import console_main

console_main()
