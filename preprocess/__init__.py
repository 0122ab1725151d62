"""Dataset preprocessing scripts (installed as vlmrl.preprocess; each also runs by path)."""
