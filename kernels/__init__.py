"""Fused embedding ops behind one dispatch.

`packed_lookup` pools the rows of one packed table over many (sample, field) bags in a
single call. The reference implementation is plain torch; faster ones plug in here.
"""

from picasso.kernels.reference import packed_lookup

__all__ = ["packed_lookup"]
