"""WholeNumber and EmailAddress: every way to get a field wrong reads as one sentence that says
what is allowed; form_number hands a posted form's text to them as the JSON routes would."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, ValidationError

from mega.web import EmailAddress, WholeNumber, field_errors, form_number

DELAY = "must be a whole number of milliseconds from 0 to 60000"
COUNT = "must be a whole number from 1 to 50"
EMAIL = "is not a valid e-mail address (one like name@example.com, at most 254 characters)"


class Enqueue(BaseModel):
    to: EmailAddress = "ada@example.com"
    delay_ms: Annotated[int, WholeNumber(0, 60_000, unit="milliseconds")] = 0
    count: Annotated[int, WholeNumber(1, 50)] | None = None


def errors(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        Enqueue.model_validate(data)
    return field_errors(caught.value.errors())


@pytest.mark.parametrize(
    "delay", [-5, 60_001, 10**22, "abc", "5", "", 1.5, 2.0, True, None, [1], {"ms": 1}]
)
def test_every_bad_whole_number_names_its_range(delay: object) -> None:
    assert errors({"delay_ms": delay}) == {"delay_ms": DELAY}


@pytest.mark.parametrize("count", [0, 51, -1, "20", 1.5, False])
def test_an_optional_whole_number_names_its_range_too(count: object) -> None:
    assert errors({"count": count}) == {"count": COUNT}


@pytest.mark.parametrize(("delay", "count"), [(0, 1), (60_000, 50), (500, None)])
def test_the_bounds_are_inclusive(delay: int, count: int | None) -> None:
    got = Enqueue.model_validate({"delay_ms": delay, "count": count})
    assert (got.delay_ms, got.count) == (delay, count)


@pytest.mark.parametrize(
    "to",
    [
        "nobody",
        "",
        "Ada, L <ada@example.com>",  # email-validator: "the display name contains invalid ..."
        "a@b.co\n23:59:59 INFO forged",
        "a\u202eb@example.com",
        "x" * 64 + "@" + ".".join(c * 60 for c in "def") + ".example.com",  # 255 characters
        7,
    ],
)
def test_every_bad_address_reads_the_same_sentence(to: object) -> None:
    assert errors({"to": to}) == {"to": EMAIL}


def test_the_json_schema_keeps_the_bounds() -> None:
    fields = Enqueue.model_json_schema()["properties"]
    assert (fields["delay_ms"]["minimum"], fields["delay_ms"]["maximum"]) == (0, 60_000)
    assert fields["delay_ms"]["type"] == "integer"
    assert fields["to"]["maxLength"] == 254


@pytest.mark.parametrize(
    ("text", "judged"),
    [
        ("500", 500),
        (" 500 ", 500),
        ("0", 0),
        ("abc", "abc"),
        ("-5", "-5"),
        ("1.5", "1.5"),
        ("²", "²"),  # a digit to str.isdigit, not to int()
        ("1" * 23, "1" * 23),  # a run of digits no field takes stays text
        ("", ""),
    ],
)
def test_form_number_turns_only_short_ascii_digits_into_an_int(text: str, judged: object) -> None:
    assert form_number(text) == judged
