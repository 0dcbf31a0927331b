"""Domain errors raised by actions; the API turns them into 404 / 409 / 412 / 422 with the message as written."""

from __future__ import annotations


class DomainError(Exception):
    """A request that conflicts with the current state (409). `extra` is added to the API's error body."""

    def __init__(self, message: str, *, extra: dict | None = None):
        super().__init__(message)
        self.extra = extra or {}


class NotFound(DomainError):
    pass


class StaleVersion(DomainError):
    pass


class KeyReused(DomainError):
    """A request that repeats an earlier request's idempotency key with a different body (422)."""
