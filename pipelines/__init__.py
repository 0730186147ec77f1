"""Beam transforms (PackFeatures, PicassoTrain, ...) and the runnable pipelines."""
