"""vlmrl.algos."""
