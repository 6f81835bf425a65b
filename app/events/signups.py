"""UserSignedUp: the event a committed signup emits, through the outbox (SignupService)."""

from __future__ import annotations

from pydantic import BaseModel, EmailStr

from mega import Event


class SignupPayload(BaseModel):
    signup_id: int
    email: EmailStr


class UserSignedUp(Event):
    name = "user.signed_up"
    bus = "jobs"
    schema = SignupPayload  # validated when the outbox row is written
