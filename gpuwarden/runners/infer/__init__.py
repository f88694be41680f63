"""The inference runner: `task: generate` (prompts → JSONL) and `task: image_to_text` (images →
Markdown/JSON files), both resumable item by item after an out-of-memory restart or a kill.

Entry point `gpuwarden.runners.infer.main:run`; see `generate.py` and `image_to_text.py`.
"""
