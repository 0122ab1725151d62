"""The error of a configuration the run cannot start with."""


class ConfigError(ValueError):
    """A configuration the run cannot start with; the message says how to fix it (every problem, one per line)."""
