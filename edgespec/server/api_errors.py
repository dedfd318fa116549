"""Every problem with a request is an `APIError`: an HTTP status with the body OpenAI clients read
(`{"error": {"message", "type", "param", "code"}}`); `bad` and `unsupported` are the two 400s a body check raises."""

from __future__ import annotations

from typing import Any, Mapping

class APIError(Exception):
    """An HTTP error with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or default_type(status)
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, param=self.param, code=self.code, **self.extra)


def default_type(status: int) -> str:
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
        429: "rate_limit_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(message: str, type: str, *, param: str | None = None, code: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code, **extra}}


def bad(param: str | None, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code or ("invalid_value" if param else None))


def unsupported(param: str, message: str) -> APIError:
    return APIError(400, message, param=param, code="unsupported_parameter")


def json_type(v: Any) -> str:
    """The JSON type of a decoded value, as an error message names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


__all__ = ["APIError", "bad", "default_type", "error_body", "json_type", "unsupported"]
