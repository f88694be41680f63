"""Benchmarks: `make bench` (= `python -m bench [NAME ...]`) prints one table of every target."""
