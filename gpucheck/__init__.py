"""`make gpu-check`: proves gpuwarden on the hardware it is for, one step at a time.

Each step runs in its own process under a time limit (under ten minutes), writes its result as
JSON, and the runner gathers them into `gpu-report.md` and `gpu-report.json`. Without an NVIDIA
GPU every step says so in one line and is marked skipped, so the same command checks the
plumbing anywhere (CI runs it that way). `gpucheck.wheels` carries the Python packages a GPU
machine without a package registry lacks.
"""
