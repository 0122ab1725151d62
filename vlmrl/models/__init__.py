"""vlmrl.models."""
