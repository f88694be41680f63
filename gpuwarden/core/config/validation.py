"""Turn pydantic validation errors into one line per problem: where, which key, what is allowed."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuwarden.core.config.yamlsource import KeyPath, _dotted
from gpuwarden.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every user-facing model: unknown keys are errors, values re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside an annotation such as `Foo | None` or `list[Foo]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType, list, tuple, dict, typing.Annotated):
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def allowed_keys(model: type[BaseModel], parent: KeyPath) -> list[str]:
    """Field names (and aliases) accepted at `parent` inside `model`, for suggestions."""
    current: type[BaseModel] | None = model
    for part in parent:
        if current is None:
            return []
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            # a dict key (e.g. env: {NAME: ...}) or an alias: keep looking from the same model
            aliased = [f for f in current.model_fields.values() if f.alias == part]
            if not aliased:
                continue
            field = aliased[0]
        current = _model_in(field.annotation)
    if current is None:
        return []
    names: list[str] = []
    for name, field in current.model_fields.items():
        names.append(field.alias or name)
    return names


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    if choices:
        return "allowed keys: " + ", ".join(sorted(choices))
    return "remove it"


def _describe_input(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], where: Callable[[KeyPath], str]
) -> list[str]:
    """One line per problem, e.g. `spec.yaml:7: train.batch_size: must be > 0 (got -4)`."""
    problems: list[str] = []
    for err in exc.errors():
        loc: KeyPath = tuple(p for p in err["loc"] if isinstance(p, str | int))
        key = _dotted(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            hint = _suggest(str(loc[-1]) if loc else "", allowed_keys(model, loc[:-1]))
            problems.append(f"{where(loc)}: {key}: unknown key — {hint}")
            continue
        msg = err["msg"]
        msg = msg.replace("Input should be", "must be").replace("Value error, ", "")
        if kind == "missing":
            problems.append(f"{where(loc)}: {key}: required key is missing — add it")
        elif (
            kind.endswith("_type")
            or kind.startswith(("greater", "less", "literal", "too_"))
            or "parsing" in kind
        ):
            problems.append(f"{where(loc)}: {key}: {msg} (got {_describe_input(err.get('input'))})")
        else:
            problems.append(f"{where(loc)}: {key}: {msg}")
    return problems


def validate(model: type[M], data: dict[str, Any], where: Callable[[KeyPath], str]) -> M:
    """Validate `data` as `model`; raise ConfigError with located one-line problems."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, where)) from None
