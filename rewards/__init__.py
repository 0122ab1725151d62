"""The reward-function library (installed as vlmrl.rewards; each file also loads by path)."""
