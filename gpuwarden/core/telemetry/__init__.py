"""Telemetry readers: NVML for GPUs (nvidia-ml-py), psutil for the host."""
