"""The gpuwarden daemon: sampler, store writer, run supervisor and the HTTP API on a Unix socket."""
