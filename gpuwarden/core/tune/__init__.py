"""Tuning upward: short probe processes search the micro-batch (then precision and compile) for
the best throughput within a memory headroom; results are remembered by fingerprint."""
