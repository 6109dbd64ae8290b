"""Tucker HOOI: per-mode TTM chains and SVD updates, checkpoints and results."""
