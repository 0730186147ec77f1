"""The Beam transforms of picasso's pipelines: decode, pack, train (with a handler per mode),
evaluate, and the keyed-state join of impressions with their labels."""
