"""picasso: the training stage (spec, packing, embeddings, models, trainer, checkpoints).

It never imports Beam or MLflow: the Trainer takes an iterator of PackedBatch, and Beam
(picasso.pipelines) is one way to feed it.
"""

__version__ = "0.1.0"
