"""vlmrl.workers."""
