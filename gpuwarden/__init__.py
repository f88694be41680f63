"""gpuwarden: watch NVIDIA GPUs, keep their history, supervise runs that retune themselves."""

__version__ = "0.1.0"
