"""vlmrl.data."""
