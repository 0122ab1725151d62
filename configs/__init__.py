"""Hydra configs of vlmrl (installed as vlmrl.configs)."""
