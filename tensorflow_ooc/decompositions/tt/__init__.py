"""Tensor trains: TT-ALS and randomized rTT-ALS, their steps, checkpoints and results."""
