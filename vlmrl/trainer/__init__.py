"""vlmrl.trainer."""
