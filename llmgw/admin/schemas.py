"""Admin request bodies as frozen attrs classes, parsed by one strict cattrs converter.

Unknown fields are rejected; a bad body becomes a 400 whose message lists every problem as
``cattrs.transform_error`` words it (e.g. ``invalid value for type, expected int @ $.rate_limit_requests``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, TypeVar, get_args, get_origin

import attrs
import cattrs
from attrs import validators as v
from cattrs.gen import make_dict_structure_fn, override

from llmgw.errors import InvalidRequest
from llmgw.storage import bounds
from llmgw.storage.rollup import REPORT_GROUPINGS

__all__ = [
    "KeyCreate",
    "ReportRange",
    "Rotate",
    "SubjectBudgetUpdate",
    "TeamCreate",
    "parse",
    "to_json",
]

T = TypeVar("T")


def _rfc3339(value: Any, _type: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError("expected an RFC 3339 string")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError("the time needs a zone, e.g. 2027-01-31T00:00:00Z")
    problem = bounds.time_problem(moment)
    if problem is not None:
        raise ValueError(f"the time {problem}")
    return moment


def _strict_int(value: Any, _type: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected an integer")
    return value


def _strict_number(value: Any, _type: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a number")
    return float(value)


def _iso_date(value: Any, _type: Any) -> date:
    try:
        day = date.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        day = None
    if day is None:
        raise ValueError("expected a date, YYYY-MM-DD")
    problem = bounds.time_problem(datetime(day.year, day.month, day.day, tzinfo=UTC))
    if problem is not None:
        raise ValueError(f"the date {problem}")
    return day


def _strict_str(value: Any, _type: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    if "\x00" in value:  # PostgreSQL's text cannot hold NUL: refused here, not as a 500 there
        raise ValueError("a NUL character is not allowed")
    return value


def _is_homogeneous_tuple(type_: Any) -> bool:
    return get_origin(type_) is tuple and get_args(type_)[1:] == (Ellipsis,)


def _json_array(type_: Any) -> Callable[[Any, Any], tuple[Any, ...]]:
    """``tuple[X, ...]`` from a JSON array only: cattrs would take any iterable, so "abc" -> a, b, c."""
    item = get_args(type_)[0]

    def structure(value: Any, _type: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ValueError("expected a list")
        return tuple(CONVERTER.structure(element, item) for element in value)

    return structure


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(datetime, _rfc3339)
    converter.register_structure_hook(uuid.UUID, lambda value, _t: uuid.UUID(str(value)))
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(float, _strict_number)
    converter.register_structure_hook(str, _strict_str)
    converter.register_structure_hook(date, _iso_date)
    converter.register_structure_hook_factory(_is_homogeneous_tuple, _json_array)
    converter.register_unstructure_hook(uuid.UUID, str)
    converter.register_unstructure_hook(datetime, lambda moment: moment.isoformat())
    converter.register_unstructure_hook(date, lambda day: day.isoformat())
    return converter


CONVERTER = _make_converter()

# Positive and within the INTEGER columns that store them.
_positive = v.and_(v.gt(0), v.le(bounds.INT4_MAX))
_optional_positive = v.optional(_positive)


def _budget(_instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    problem = None if value is None else bounds.budget_problem(value)
    if problem is not None:
        raise ValueError(f"{attribute.name} {problem}")


def _model_names(
    _instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]
) -> None:
    if any(not name.strip() for name in value):
        raise ValueError(f"{attribute.name} must not contain empty model names")


@attrs.frozen
class KeyCreate:
    name: str = attrs.field(validator=v.min_len(1))
    subject_id: uuid.UUID | None = None
    rate_limit_requests: int = attrs.field(default=60, validator=_positive)
    rate_limit_window_seconds: int = attrs.field(default=60, validator=_positive)
    allowed_models: tuple[str, ...] = attrs.field(default=(), validator=_model_names)
    expires_at: datetime | None = None
    tokens_per_minute: int | None = attrs.field(default=None, validator=_optional_positive)
    max_concurrent_requests: int | None = attrs.field(default=None, validator=_optional_positive)
    team_id: uuid.UUID | None = None


def _whole_window(
    instance: TeamCreate, _attribute: attrs.Attribute[Any], value: int | None
) -> None:
    if (instance.rate_limit_requests is None) != (value is None):
        raise ValueError(
            "rate_limit_requests and rate_limit_window_seconds are set (or cleared) together"
        )


def _group(_instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not value.strip():
        raise ValueError(f"{attribute.name} must not be blank (null: no group)")


@attrs.frozen
class TeamCreate:
    """A team's settings (POST /teams; PATCH validates the team as it would be after the change)."""

    name: str = attrs.field(validator=v.and_(v.min_len(1), v.max_len(200)))
    monthly_budget_usd: float | None = attrs.field(default=None, validator=_budget)
    rate_limit_requests: int | None = attrs.field(default=None, validator=_optional_positive)
    rate_limit_window_seconds: int | None = attrs.field(
        default=None, validator=v.and_(_optional_positive, _whole_window)
    )
    tokens_per_minute: int | None = attrs.field(default=None, validator=_optional_positive)
    max_concurrent_requests: int | None = attrs.field(default=None, validator=_optional_positive)
    allowed_models: tuple[str, ...] = attrs.field(default=(), validator=_model_names)
    oidc_group: str | None = attrs.field(default=None, validator=_group)
    oidc_admin_group: str | None = attrs.field(default=None, validator=_group)


@attrs.frozen
class Rotate:
    grace_seconds: float = attrs.field(
        default=0, validator=v.and_(v.ge(0), v.le(bounds.MAX_GRACE_SECONDS))
    )


@attrs.frozen
class SubjectBudgetUpdate:
    monthly_budget_usd: float | None = attrs.field(validator=_budget)


def _grouping(_instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in REPORT_GROUPINGS:
        raise ValueError(f"{attribute.name} must be one of {', '.join(REPORT_GROUPINGS)}")


@attrs.frozen
class ReportRange:
    """The usage report's query parameters (``from`` and ``to`` are whole UTC days)."""

    by: str = attrs.field(default="day", validator=_grouping)
    from_: date | None = None
    to: date | None = None
    key_id: uuid.UUID | None = None
    subject_id: uuid.UUID | None = None
    team_id: uuid.UUID | None = None


CONVERTER.register_structure_hook(
    ReportRange,
    make_dict_structure_fn(ReportRange, CONVERTER, from_=override(rename="from")),
)


def _describe(exc: BaseException, wanted: type | None) -> str:
    """cattrs' wording, plus what a validator said (it names the field and its bound)."""
    if isinstance(exc, ValueError) and str(exc):
        return f"invalid value ({exc})"
    return cattrs.v.format_exception(exc, wanted)


def parse(body: Any, cls: type[T]) -> T:
    """Structure a JSON body into ``cls`` or raise a 400 naming every problem."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    try:
        return CONVERTER.structure(body, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        problems = (
            cattrs.transform_error(exc, format_exception=_describe)
            if isinstance(exc, cattrs.BaseValidationError)
            else [str(exc)]
        )
        raise InvalidRequest("; ".join(problems)) from None


def to_json(value: Any) -> Any:
    return CONVERTER.unstructure(value)
