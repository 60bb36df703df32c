"""tunectl: distributed autotuning of LLM inference kernels, and the bundles serving loads."""

__version__ = "0.1.0"
