"""vlmrl.rollout."""
