"""burstsched: a burst- and prefix-cache-aware scheduler in front of a pool of vLLM replicas."""

__version__ = "0.1.0"

__all__ = ["__version__"]
