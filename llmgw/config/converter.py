"""The providers file's tables into attrs specs, through one strict cattrs converter.

TOML's values are typed already, so nothing is coerced: ``"5"`` is no number, ``1`` no boolean and
``1.5`` no integer. Unknown keys are refused. A problem is a :class:`ConfigProblem` naming the key
where it is (``providers[1].max_retries``) and what was expected, with the value shown unless the
key holds a secret. A spec's own checks are attrs validators made with :func:`check`; a plugin's
options spec (``llmgw.providers.plugin``) is structured by the same converter and worded the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs

__all__ = ["CONVERTER", "ConfigProblem", "Invalid", "check", "show", "structure"]

T = TypeVar("T")


class ConfigProblem(Exception):
    """``where`` (a key's path in the file) holds a bad value; ``problem`` says what was expected."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


class Invalid(ValueError):
    """A spec's validator refusing ``field``'s value (raised by the validators :func:`check` makes)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


def show(value: object) -> str:
    """A value from the file, quoted like TOML would write it, on one line."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return type(value).__name__


def check(test: Callable[[Any], bool], expected: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: ``test`` must hold for a set value, else "expected ..., got VALUE"."""

    def validate(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and not test(value):
            raise Invalid(attribute.name, f"expected {expected}, got {show(value)}")

    return validate


def _exactly(kind: type, wording: str) -> Callable[[Any, Any], Any]:
    # bool is an int to Python, not to TOML: true is no number, 1 no boolean.
    def structure(value: Any, _type: Any) -> Any:
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise ValueError(f"expected {wording}, got {show(value)}")
        return value

    return structure


def _number(value: Any, _type: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {show(value)}")
    return float(value)


def _is_literal(type_: Any) -> bool:
    return get_origin(type_) is Literal


def _literal(type_: Any) -> Callable[[Any, Any], Any]:
    choices = get_args(type_)
    shown = [show(choice) for choice in choices]
    expected = " or ".join(shown) if len(shown) <= 2 else "one of " + ", ".join(shown)

    def structure(value: Any, _type: Any) -> Any:
        if value not in choices or not isinstance(value, str):
            raise ValueError(f"expected {expected}, got {show(value)}")
        return value

    return structure


def _is_array(type_: Any) -> bool:
    return get_origin(type_) is tuple and get_args(type_)[1:] == (Ellipsis,)


def _array(type_: Any) -> Callable[[Any, Any], tuple[Any, ...]]:
    """``tuple[X, ...]`` from a TOML array only: cattrs would take any iterable, "abc" as a, b, c."""
    item = get_args(type_)[0]

    def structure(value: Any, _type: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ValueError(f"expected an array, got {show(value)}")
        return tuple(CONVERTER.structure(element, item) for element in value)

    return structure


def _is_string_table(type_: Any) -> bool:
    return get_origin(type_) in (Mapping, dict) and get_args(type_) == (str, str)


def _string_table(_type: Any) -> Callable[[Any, Any], dict[str, str]]:
    def structure(value: Any, _type: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            raise ValueError("expected a table")
        for key, item in value.items():
            if not isinstance(item, str):
                # Header values may be secrets: the value is not shown.
                raise Invalid(key, "expected a string")
        return dict(value)

    return structure


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str, _exactly(str, "a string"))
    converter.register_structure_hook(bool, _exactly(bool, "true or false"))
    converter.register_structure_hook(int, _exactly(int, "an integer"))
    converter.register_structure_hook(float, _number)
    converter.register_structure_hook_factory(_is_literal, _literal)
    converter.register_structure_hook_factory(_is_array, _array)
    converter.register_structure_hook_factory(_is_string_table, _string_table)
    return converter


CONVERTER = _make_converter()


def _problems(exc: BaseException, where: str) -> Iterator[ConfigProblem]:
    """Each problem inside ``exc`` (cattrs groups them per class), at the key where it is."""
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        expected = ", ".join(attrs.fields_dict(exc.cl))
        for key in sorted(exc.extra_fields):
            yield ConfigProblem(f"{where}.{key}", f"unknown key; expected one of {expected}")
    elif isinstance(exc, cattrs.ClassValidationError):
        with_notes, without = exc.group_exceptions()
        for inner, note in with_notes:
            yield from _problems(inner, f"{where}.{note.name}")
        for inner in without:
            yield from _problems(inner, where)
    elif isinstance(exc, cattrs.IterableValidationError):
        with_index, without = exc.group_exceptions()
        for inner, item in with_index:
            yield from _problems(inner, f"{where}[{item.index}]")
        for inner in without:
            yield from _problems(inner, where)
    elif isinstance(exc, Invalid):
        yield ConfigProblem(f"{where}.{exc.field}", str(exc))
    elif isinstance(exc, KeyError):
        yield ConfigProblem(where, "is required")
    else:
        yield ConfigProblem(where, str(exc) or type(exc).__name__)


def structure(table: Mapping[str, Any], cls: type[T], where: str) -> T:
    """``table`` as a ``cls``, or the first :class:`ConfigProblem` in it (in the spec's order)."""
    try:
        return CONVERTER.structure(table, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        problems = list(_problems(exc, where))
        raise problems[0] if problems else ConfigProblem(where, str(exc)) from None
