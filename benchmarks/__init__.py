"""Side-by-side benchmarks: `python -m benchmarks.NAME [--json]`."""
