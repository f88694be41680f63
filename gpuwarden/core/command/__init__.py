"""Users' own programs (`kind: command`): submit-time completion, framework presets, and each
attempt's preparation (argv, config copy, environment, `{resume_from}`, the recorded diff).

`complete.complete_command` runs at submit; `prepare.prepare_attempt` before every attempt.
"""
