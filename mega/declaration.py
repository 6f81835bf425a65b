"""What every declaration shares: a Job, Listener, Event, Schedule or Worker class is checked by
a pydantic model of its class attributes (`JobDeclaration` and the like, next to each kind), and
`validate_declaration` reports every problem at once in one RegistrationError whose parts name
the field and say what is allowed: `job 'EmailJob' is invalid: retries: must be an int >= 0,
got True; bus: ...`.

Strict types refuse what would be a typo (`retries = True` is not the number 1); `rule` turns
whatever pydantic found wrong with a value into one plain sentence; the aliases a declaration may
name (buses, caches, locks) come in the validation context as `<kind>_aliases`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, TypeVar, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from mega.errors import RegistrationError

D = TypeVar("D", bound="Declaration")


class Declaration(BaseModel):
    """Base of the declaration models: read-only, and a field may hold any object (a class, a
    function)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


def rule(sentence: str) -> WrapValidator:
    """Report any failure of the value, of its type or of a constraint, as `sentence` and the
    value: `must be a positive int, got True`."""

    def check(value: object, handler: ValidatorFunctionWrapHandler) -> object:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"{sentence}, got {value!r}") from None

    return WrapValidator(check)


def matching(pattern: re.Pattern[str]) -> AfterValidator:
    """A string `pattern` matches in full (put a `rule` after it to say what is allowed)."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"does not match {pattern.pattern}")
        return value

    return AfterValidator(check)


def declared_alias(value: object, kind: str, info: ValidationInfo) -> str:
    """`value` when it is one of the aliases of `kind` ("bus", "cache") the validation context
    gives as `<kind>_aliases`; ValueError listing them otherwise."""
    aliases: Collection[str] = (info.context or {}).get(f"{kind}_aliases", ())
    if isinstance(value, str) and value in aliases:
        return value
    declared = ", ".join(sorted(aliases)) or "none"
    raise ValueError(f"{value!r} is not a declared {kind} alias (declared: {declared})")


PositiveInt = Annotated[StrictInt, Field(ge=1), rule("must be a positive int")]
NonNegativeInt = Annotated[StrictInt, Field(ge=0), rule("must be an int >= 0")]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1), rule("must be a non-empty string")]


def validate_declaration(
    model: type[D],
    cls: type,
    heading: str,
    context: Mapping[str, object] | None = None,
    *,
    field_prefix: str = "",
) -> D:
    """`model` validated from the class attributes of `cls` named like its fields (an absent
    one reads as None). RegistrationError `<heading><field_prefix>field: problem; ...` lists
    every problem otherwise."""
    attrs = {
        field.alias or name: getattr(cls, field.alias or name, None)
        for name, field in model.model_fields.items()
    }
    try:
        return model.model_validate(attrs, context=dict(context or {}))
    except ValidationError as exc:
        # The fields a model declares itself come first, then those it inherits (a Job's
        # subject before the settings every consumed class shares).
        own = list(vars(model).get("__annotations__", {}))
        order = {name: i for i, name in enumerate(dict.fromkeys([*own, *model.model_fields]))}
        problems = sorted(describe(exc, model), key=lambda p: order.get(p.split(":")[0], 0))
        raise RegistrationError(heading + "; ".join(field_prefix + p for p in problems)) from None


def validate_subclass(
    model: type[D], cls: object, base: type, kind: str, context: Mapping[str, object]
) -> D:
    """`validate_declaration` of a class that must subclass `base` (a Job, an Event, a
    Listener): RegistrationError `<Name>: a <kind> must be a subclass of mega.<Base>` when it
    does not, `<kind> '<Name>' is invalid: ...` for its fields."""
    where = getattr(cls, "__name__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, base)):
        article = "an" if kind[0] in "aeiou" else "a"
        raise RegistrationError(
            f"{where}: {article} {kind} must be a subclass of mega.{kind.capitalize()}"
        )
    return validate_declaration(model, cls, f"{kind} {where!r} is invalid: ", context)


def describe(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """One `field: sentence` per problem, in the order of the fields (a nested one as
    `lock.ttl`); the unknown keys of a nested dict together, with the keys it allows."""
    lines: list[str | tuple[str, list[str]]] = []
    unknown: dict[str, list[str]] = {}
    for error in exc.errors(include_url=False):
        loc = [str(part) for part in error["loc"]]
        if error["type"] == "extra_forbidden":
            where = ".".join(loc[:-1])
            if where not in unknown:
                unknown[where] = []
                lines.append((where, unknown[where]))
            unknown[where].append(loc[-1])
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        lines.append(f"{'.'.join(loc) or 'class'}: {message}")
    return [line if isinstance(line, str) else _unknown_keys(model, *line) for line in lines]


def _unknown_keys(model: type[BaseModel], where: str, keys: list[str]) -> str:
    allowed = ", ".join(_fields_at(model, where.split(".") if where else []))
    return f"{where or 'class'}: unknown keys {sorted(keys)}; allowed: {allowed}"


def _fields_at(model: type[BaseModel], loc: Sequence[str]) -> list[str]:
    """The field names of the model nested in `model` at `loc` (through `X | None` too)."""
    for part in loc:
        annotation = model.model_fields[part].annotation
        model = next(
            kind
            for kind in (annotation, *get_args(annotation))
            if isinstance(kind, type) and issubclass(kind, BaseModel)
        )
    return [field.alias or name for name, field in model.model_fields.items()]
