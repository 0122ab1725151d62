"""vlmrl.reward."""
