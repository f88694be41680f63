"""Multi-process runs ("gangs") started by `torch.distributed.run`: the launch command, the files
each rank writes, how a gang ended, and which GPUs it gets. Pure functions; no torch here."""
