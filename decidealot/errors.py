"""The service's errors, each with its status and envelope. Messages are fixed, safe strings:
nothing upstream (keys, URLs, bodies, tracebacks) is ever copied into them."""

from __future__ import annotations

import msgspec

from decidealot.contract import ErrorBody, Json, Loc, ValidationErrorBody, ValidationIssue


class DecidealotError(Exception):
    status: int = 500
    code: str = "INTERNAL_ERROR"
    message: str = "the request could not be completed"
    headers: dict[str, str] = {}  # noqa: RUF012 (read-only; subclasses replace it)

    def __init__(self, message: str | None = None, details: dict[str, Json] | None = None):
        super().__init__(message or self.message)
        if message is not None:
            self.message = message
        self.details: dict[str, Json] = details or {}

    def envelope(self) -> ErrorBody | ValidationErrorBody:
        """The body HTTP answers with, and an MCP tool error's text."""
        return ErrorBody(self.code, self.message, self.details)


class Unauthorized(DecidealotError):
    status, code, message = 401, "UNAUTHORIZED", "a valid bearer token is required"


class ProviderBusy(DecidealotError):
    status, code = 409, "PROVIDER_BUSY"
    message = "a local provider is serving a decision; nothing was unloaded"


class RequestTooLarge(DecidealotError):
    status, code, message = 413, "REQUEST_TOO_LARGE", "the request body exceeds the size limit"


class UnsupportedEncoding(DecidealotError):
    status, code = 415, "UNSUPPORTED_CONTENT_ENCODING"
    message = "Content-Encoding must be identity, gzip or zstd"


class MalformedBody(DecidealotError):
    status, code, message = 400, "MALFORMED_BODY", "the request body could not be decoded"


class RequestTimeout(DecidealotError):
    status, code, message = 408, "REQUEST_TIMEOUT", "the request body was not received in time"


class UnsupportedMediaType(DecidealotError):
    status, code = 415, "UNSUPPORTED_MEDIA_TYPE"
    message = "Content-Type must be application/json"


class ProviderUnavailable(DecidealotError):
    """A provider cannot answer now: not ready, crashed, timed out, or answered badly."""

    status, code, message = 503, "PROVIDER_UNAVAILABLE", "the selected provider is unavailable"


class ShuttingDown(ProviderUnavailable):
    """The service is draining (SIGTERM): this replica takes nothing new, another one will."""

    message = "the service is shutting down"
    headers = {"Retry-After": "1"}  # noqa: RUF012 (a retry reaches another replica)


class ProviderOverloaded(ProviderUnavailable):
    """`DECIDEALOT_MAX_PENDING_REQUESTS` decisions are already admitted: come back shortly."""

    message = "the local providers are at capacity; retry shortly"
    headers = {"Retry-After": "1"}  # noqa: RUF012 (as laya serve; the official SDK honours it)


class RequestInvalid(DecidealotError):
    """The 422 TypeSafe validation envelope: `{"detail": [issues]}`. Provider code raises it
    with issues located within the request (`question`), which the executor places in the body
    (`within`): one type carries every input error across every boundary, frames included."""

    status, code, message = 422, "VALIDATION_ERROR", "the request is invalid"

    def __init__(self, issues: list[ValidationIssue]):
        super().__init__()
        self.issues = issues

    def envelope(self) -> ValidationErrorBody:
        return ValidationErrorBody(self.issues)

    @classmethod
    def question(
        cls, name: str | None, msg: str, loc: Loc | None = None, input: Json = None
    ) -> RequestInvalid:
        """Input question `name` cannot take (None: the questions as a whole, e.g. their
        summed cost); `loc` continues inside the question."""
        where: Loc = ["questions"] if name is None else ["questions", name]
        return cls([ValidationIssue([*where, *(loc or [])], msg, "value_error", input)])

    def within(self, where: Loc) -> RequestInvalid:
        """The same issues, located under `where` (the request's place in the body)."""
        return RequestInvalid(
            [msgspec.structs.replace(issue, loc=[*where, *issue.loc]) for issue in self.issues]
        )


def state_too_long(total: int, question: str, room: int, reads: str) -> RequestInvalid:
    """The 422 of `DECIDEALOT_LONG_STATES=refuse`: `question`, the tightest, leaves `room` of the
    state's `total` tokens in what the model `reads` ("laya-english's 512-token rows")."""
    msg = (
        f"the state has {total} tokens and question {question!r} leaves room for {room} of them "
        f"in {reads}; DECIDEALOT_LONG_STATES=refuse refuses a state that would be cut: shorten "
        "it or split it over several requests"
    )
    return RequestInvalid([ValidationIssue(["state"], msg, "value_error")])


def over_token_limit(cost: int, limit: int) -> RequestInvalid:
    """The 422 for a request whose model tokens exceed `DECIDEALOT_MAX_REQUEST_TOKENS`."""
    return RequestInvalid.question(
        None,
        f"this request costs {cost} model tokens; DECIDEALOT_MAX_REQUEST_TOKENS "
        f"allows at most {limit} per request: split its questions over several requests",
    )
