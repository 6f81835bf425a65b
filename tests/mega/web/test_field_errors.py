"""field_errors: pydantic's errors as the plain sentences a form shows under each field."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, EmailStr, Field, ValidationError, field_validator

from mega.web import field_errors
from mega.web.fields import EMAIL_SENTENCE


class Signup(BaseModel):
    email: EmailStr
    mode: Literal["ok", "rollback"] = "ok"
    delay_ms: Annotated[int, Field(ge=0, le=60000, strict=True)] = 0
    note: Annotated[str, Field(max_length=5)] = ""

    @field_validator("note")
    @classmethod
    def _no_shouting(cls, value: str) -> str:
        if value.isupper():
            raise ValueError("must not be all capitals")
        return value


def errors(data: dict[str, object]) -> dict[str, str]:
    with pytest.raises(ValidationError) as caught:
        Signup.model_validate(data)
    return field_errors(caught.value.errors())


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({}, "email", "is required"),
        ({"email": "nobody"}, "email", EMAIL_SENTENCE),  # not email-validator's reason
        ({"email": "a@b.com", "mode": "later"}, "mode", "must be one of 'ok' or 'rollback'"),
        ({"email": "a@b.com", "delay_ms": "5"}, "delay_ms", "must be a whole number"),
        ({"email": "a@b.com", "delay_ms": -1}, "delay_ms", "must be at least 0"),
        ({"email": "a@b.com", "delay_ms": 60001}, "delay_ms", "must be at most 60000"),
        ({"email": "a@b.com", "note": "abcdef"}, "note", "must be at most 5 characters"),
        ({"email": "a@b.com", "note": "LOUD"}, "note", "must not be all capitals"),
        ({"email": "a@b.com", "note": 7}, "note", "must be text"),
    ],
)
def test_each_kind_of_error_reads_as_a_plain_sentence(
    data: dict[str, object], field: str, message: str
) -> None:
    assert errors(data)[field] == message


def test_the_first_error_per_field_wins_and_nested_fields_are_dotted() -> None:
    class Outer(BaseModel):
        inner: Signup

    with pytest.raises(ValidationError) as caught:
        Outer.model_validate({"inner": {"email": "x", "delay_ms": 1.5}})
    assert field_errors(caught.value.errors()) == {
        "inner.email": EMAIL_SENTENCE,
        "inner.delay_ms": "must be a whole number",
    }
