"""The base of every API model: its validator is built when it first validates, not on import.

A CLI command parses one or two kinds of answer; building the validators of all the API's models
when the module loads cost every command a few hundred milliseconds before it said anything.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ApiModel(BaseModel):
    model_config = ConfigDict(defer_build=True)
