"""Turn pydantic validation errors into one line per problem: where, which key, what is allowed."""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from gpuwarden.core.config.excerpt import is_key_name, value_excerpt
from gpuwarden.core.config.yamlsource import KeyPath, _dotted
from gpuwarden.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every user-facing model: unknown keys are errors, values re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads `true` as 1 where a number goes: `stop_grace_seconds: true` would be a
        # one-second grace nobody asked for. Text stays accepted: variables and flags are text.
        if info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and _takes_number(annotation) and not _takes_bool(annotation):
            raise ValueError(f"must be a number, not {str(value).lower()}")
        # `.nan` or `inf` would pass a bound check's wording ("≤ 3600, got nan") or none at all.
        if _takes_number(annotation) and _not_finite(value, text_too=str not in _leaf_types(annotation)):
            raise ValueError(f"must be a finite number, not {value}")
        return value


def _not_finite(value: Any, *, text_too: bool) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if text_too and isinstance(value, str):
        try:
            return not math.isfinite(float(value))
        except ValueError:
            return False
    return False


def _leaf_types(annotation: Any) -> list[Any]:
    """The types a value may take under `annotation`: `float | None` → [float, NoneType]; a
    Literal's values are kept as they are."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return [leaf for arg in get_args(annotation) for leaf in _leaf_types(arg)]
    if origin is typing.Annotated:
        return _leaf_types(get_args(annotation)[0])
    if origin is Literal:
        return list(get_args(annotation))
    return [annotation]


def _takes_number(annotation: Any) -> bool:
    numbers = (int, float)
    return any(
        (isinstance(leaf, type) and issubclass(leaf, numbers) and not issubclass(leaf, bool))
        or (isinstance(leaf, numbers) and not isinstance(leaf, bool))
        for leaf in _leaf_types(annotation)
    )


def _takes_bool(annotation: Any) -> bool:
    return any(leaf is bool or isinstance(leaf, bool) or leaf is Any for leaf in _leaf_types(annotation))


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


def _union_members(annotation: Any) -> list[Any]:
    if get_origin(annotation) in (Union, types.UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return []


def _member_tag(member: Any) -> str:
    """The name pydantic puts in an error location for one member of a union."""
    if isinstance(member, type):
        return member.__name__
    return str(member).replace("typing.", "")


def _pick_member(members: list[Any], tag: str) -> Any:
    """The union member a pydantic location tag names (`PolicyOverride`, `list[...]`, `int`)."""
    for m in members:
        if _member_tag(m) == tag:
            return m
    for prefix, origin in (("list[", list), ("dict[", dict), ("tuple[", tuple)):
        if tag.startswith(prefix):
            return next((m for m in members if get_origin(m) is origin), None)
    if tag.startswith("function-"):
        return members[0]
    return None


def _child(annotation: Any, part: str | int) -> Any:
    model = _model_in(annotation) if not isinstance(annotation, type) else annotation
    if isinstance(part, str) and isinstance(model, type) and issubclass(model, BaseModel):
        field = model.model_fields.get(part)
        return field.annotation if field is not None else None
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[-1] if args else None


def clean_location(model: type[BaseModel], loc: KeyPath) -> tuple[KeyPath, bool]:
    """`loc` without the union-member tags pydantic inserts (`policy.PolicyOverride.x` →
    `policy.x`), and whether a union member was named (so a scalar member's error can be noise)."""
    out: list[str | int] = []
    annotation: Any = model
    tagged = False
    for part in loc:
        members = _union_members(annotation)
        if members and isinstance(part, str):
            member = _pick_member(members, part)
            if member is not None or part in ("str", "int", "float", "bool"):
                tagged = True
                annotation = member
                continue
        out.append(part)
        annotation = _child(annotation, part)
    return tuple(out), tagged


# What pydantic's own words name in Python terms (`instance of RetentionSettings`, `<class
# 'pathlib.Path'>`), said as what a YAML file or a JSON body holds.
_MAPPING = "a mapping (key: value lines)"
_PLAIN_WORDS = {
    "dict_type": _MAPPING,
    "model_type": _MAPPING,
    "model_attributes_type": _MAPPING,
    "dataclass_type": _MAPPING,
    "path_type": "a path (text)",
}

_SCALAR_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true/false",
    "bool_parsing": "true/false",
    "list_type": "a list",
    "dict_type": _MAPPING,
    "model_type": _MAPPING,
}
_SCALAR_TYPE_ERRORS = set(_SCALAR_NAMES)


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    if choices:
        return _allowed(choices)
    return "remove it"


def _unknown_key(model: type[BaseModel], loc: KeyPath, where: Callable[[KeyPath], str]) -> str:
    allowed = allowed_keys(model, loc[:-1])
    if loc and is_key_name(loc[-1]):
        return f"{where(loc)}: {_dotted(loc)}: unknown key — {_suggest(str(loc[-1]), allowed)}"
    # Not shown: a "key" that is no key name is most likely a line of some other file.
    parent = f" in {_dotted(loc[:-1])}" if len(loc) > 1 else ""
    return f"{where(loc)}: an unknown key{parent} that is no key name — remove it ({_allowed(allowed)})"


def _allowed(choices: list[str]) -> str:
    return "allowed keys: " + ", ".join(sorted(choices)) if choices else "no keys are allowed there"


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], where: Callable[[KeyPath], str]
) -> list[str]:
    """One line per problem, e.g. `spec.yaml:7: train.batch_size: must be > 0 (got -4)`."""
    problems: list[str] = []
    errors = exc.errors()
    cleaned = [clean_location(model, tuple(p for p in e["loc"] if isinstance(p, str | int))) for e in errors]
    merged: set[KeyPath] = set()
    for err, (loc, tagged) in zip(errors, cleaned, strict=True):
        # Every branch of a scalar union refused the value: one line listing what is accepted.
        same = [e for e, (c, t) in zip(errors, cleaned, strict=True) if c == loc and t]
        if tagged and len(same) > 1 and all(e["type"] in _SCALAR_TYPE_ERRORS for e in same):
            if loc not in merged:
                merged.add(loc)
                kinds = ", ".join(dict.fromkeys(_SCALAR_NAMES[e["type"]] for e in same))
                got = value_excerpt(err.get("input"))
                problems.append(f"{where(loc)}: {_dotted(loc)}: must be one of: {kinds} (got {got})")
            continue
        # A mapping given to a `name | {inline}` field fails the scalar branch too; that error is
        # noise when the mapping branch has its own, more precise, complaint.
        if tagged and err["type"] in _SCALAR_TYPE_ERRORS and isinstance(err.get("input"), dict | list):
            others = [c for c, t in cleaned if t and c[: len(loc)] == loc and c != loc]
            if others or sum(1 for c, _ in cleaned if c == loc) > 1:
                continue
        key = _dotted(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            problems.append(_unknown_key(model, loc, where))
            continue
        plain = _PLAIN_WORDS.get(kind)
        msg = f"must be {plain}" if plain else err["msg"]
        msg = msg.replace("Input should be", "must be").replace("Value error, ", "")
        if kind == "missing":
            problems.append(f"{where(loc)}: {key}: required key is missing — add it")
        elif (
            kind.endswith("_type")
            or kind.startswith(("greater", "less", "literal", "too_"))
            or "parsing" in kind
        ):
            problems.append(f"{where(loc)}: {key}: {msg} (got {value_excerpt(err.get('input'))})")
        else:
            problems.append(f"{where(loc)}: {key}: {msg}")
    return problems


# What each top-level model is called in the line that says a file is none of them.
_WHAT = {"RunSpec": "run spec", "Settings": "gpuwarden config", "RetunePolicy": "retune policy"}


def validate(model: type[M], data: dict[str, Any], where: Callable[[KeyPath], str]) -> M:
    """Validate `data` as `model`; raise ConfigError with located one-line problems."""
    refuse_foreign(model, data, where)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, where)) from None


def refuse_foreign(model: type[BaseModel], data: dict[str, Any], where: Callable[[KeyPath], str]) -> None:
    """A mapping with none of the model's keys is another file: `/etc/shadow` parses as one key
    per line. One line for it, showing none of its content, not one line per key."""
    known = set(allowed_keys(model, ()))
    if not data or any(key in known for key in data):
        return
    (first, *rest) = data
    if not rest and is_key_name(first) and difflib.get_close_matches(first, known, n=1, cutoff=0.6):
        return  # one misspelt key: its own line suggests the right one
    what = _WHAT.get(model.__name__, "file of this kind")
    none_of_its = "its only key is not" if not rest else f"none of its {len(data)} keys is"
    raise ConfigError(
        [f"{where(())}: {none_of_its} a {what} key — is it the right file? ({_allowed(sorted(known))})"]
    )
