"""The matrix: model, codec, store and the pure reconciliation pass."""
