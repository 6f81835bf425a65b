"""Form fields whose every error is one plain sentence that says what is allowed.

    class EnqueueRequest(BaseModel):
        to: EmailAddress
        delay_ms: Annotated[int, WholeNumber(0, 60_000, unit="milliseconds")] = 0

A delay of -5, of 23 digits, of "abc", of 1.5 or of true all read "must be a whole number of
milliseconds from 0 to 60000": one sentence with the range, whatever was wrong, so a person
filling in a form learns in one go what to type (pydantic's own errors name only the bound
that was crossed, or none). The JSON schema still carries the bounds (minimum, maximum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import EmailStr, Field, GetCoreSchemaHandler, ValidationError, WrapValidator
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

EMAIL_MAX_CHARS = 254  # RFC 5321's limit on a path, the longest address a mail server takes
EMAIL_SENTENCE = (
    f"is not a valid e-mail address (one like name@example.com, at most {EMAIL_MAX_CHARS} "
    "characters)"
)
# Form text longer than this is not a number any field here takes: int() of thousands of
# digits is slow (Python refuses past 4300), so such text stays text, refused as text.
FORM_NUMBER_MAX_DIGITS = 9


@dataclass(frozen=True)
class WholeNumber:
    """`Annotated[int, WholeNumber(lo, hi)]`: an int from lo to hi inclusive, strict (a JSON
    number, not "5", 1.5 or true), every error worded as `sentence`."""

    lo: int
    hi: int
    unit: str | None = None  # "milliseconds": "a whole number of milliseconds from ..."

    @property
    def sentence(self) -> str:
        what = f"a whole number of {self.unit}" if self.unit else "a whole number"
        return f"must be {what} from {self.lo} to {self.hi}"

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        bounded = core_schema.int_schema(ge=self.lo, le=self.hi, strict=True)
        return core_schema.no_info_wrap_validator_function(self._one_sentence, bounded)

    def _one_sentence(self, value: Any, check: core_schema.ValidatorFunctionWrapHandler) -> Any:
        try:
            return check(value)
        except ValidationError:
            raise PydanticCustomError("whole_number", self.sentence) from None


def _email_sentence(value: Any, check: core_schema.ValidatorFunctionWrapHandler) -> Any:
    # email-validator's reasons ("the display name contains invalid characters when not
    # quoted") are written for mail programmers; a form says what an address looks like.
    try:
        return check(value)
    except ValidationError:
        raise PydanticCustomError("email", EMAIL_SENTENCE) from None


# An e-mail address (email-validator, through pydantic): no CR, LF, NUL or bidi override can
# ride along into a log line or a header.
EmailAddress = Annotated[
    EmailStr, Field(max_length=EMAIL_MAX_CHARS), WrapValidator(_email_sentence)
]


def form_number(text: str) -> int | str:
    """A number field of a posted form, as its model should judge it: ASCII digits become an
    int, anything else stays text, which the field then refuses with its own sentence.

    Args:
        text: the field as posted; surrounding spaces are dropped, and more than
            FORM_NUMBER_MAX_DIGITS digits stay text.
    """
    text = text.strip()
    whole = text.isascii() and text.isdigit() and len(text) <= FORM_NUMBER_MAX_DIGITS
    return int(text) if whole else text
