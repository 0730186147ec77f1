"""Command-line options of the hot-row cache and interleaving, shared by `daily`, `demo`
and `stream`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from picasso.cache import CacheConfig


def add_cache_args(parser: argparse.ArgumentParser, interleave: bool = True) -> None:
    """`interleave`: also offer --no-interleave (for commands whose training interleaves)."""
    group = parser.add_argument_group("hot-row cache and interleaving")
    group.add_argument("--cache-capacity", default="10%",
                       help="fast-tier size per packed table: rows (50000), bytes (64MiB) or a share of rows (5%%), "
                            "then TABLE=SIZE for tables that differ (10%%,dim64=64MiB; `picasso plan` names the "
                            "tables); 'off' trains without the cache")
    group.add_argument("--cache-refresh-every", type=int, default=100, help="steps between admissions and evictions")
    group.add_argument("--cache-half-life", type=float, default=2000.0, help="steps for an access count to halve")
    group.add_argument("--big-tier-dir", default=None,
                       help="make every table and optimizer slot as a file here, memory-mapped, never "
                            "whole in memory (tables larger than RAM); the files stay after the run")
    if interleave:
        group.add_argument("--interleave", choices=["auto", "on", "off"], default="auto",
                           help="prepare the next batch while a step computes: auto (default) does so with a GPU, "
                                "or with CPU cores torch's threads leave free")
        group.add_argument("--no-interleave", dest="interleave", action="store_const", const="off",
                           help="the same as --interleave off")


def interleave_setting(args: argparse.Namespace) -> bool | None:
    """TrainConfig.interleave from --interleave: None (auto), True or False."""
    return {"auto": None, "on": True, "off": False}[args.interleave]


def cache_config(args: argparse.Namespace) -> CacheConfig | None:
    """The CacheConfig the options ask for; None for --cache-capacity off. A capacity that
    means nothing fails here, before any work starts."""
    from picasso.cache import CacheConfig, parse_capacity  # torch: the flags are added without it

    if str(args.cache_capacity).lower() == "off":
        return None
    default, per_table = "10%", {}
    for item in str(args.cache_capacity).split(","):
        table, _, size = item.rpartition("=")
        parse_capacity(size, num_rows=1, row_bytes=1)  # raises ValueError naming the text
        if table:
            per_table[table.strip()] = size.strip()
        else:
            default = size.strip()
    if args.cache_refresh_every < 1 or args.cache_half_life <= 0:
        raise ValueError("--cache-refresh-every must be at least 1 and --cache-half-life positive")
    return CacheConfig(capacity=default, group_capacity=per_table, refresh_every=args.cache_refresh_every,
                       half_life=args.cache_half_life, big_tier_dir=args.big_tier_dir)
