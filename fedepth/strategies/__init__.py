"""Federated learning strategies: one file per algorithm; shared arithmetic in ``aggregate``."""
