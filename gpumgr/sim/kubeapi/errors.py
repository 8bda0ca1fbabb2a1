"""API errors and the `Status` objects the Kubernetes API server answers with."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered to the client as a `v1.Status` with the given HTTP code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists',
                    {"name": name, "kind": resource})


def conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {why}',
                    {"name": name, "kind": resource})


def stale(resource: str, name: str) -> ApiError:
    return conflict(resource, name, "the object has been modified; please apply your changes to the latest "
                    "version and try again")


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(resource: str, name: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{resource} "{name}" is invalid: {message}',
                    {"name": name, "kind": resource})


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def success_status(resource: str, name: str, uid: str) -> dict[str, Any]:
    """The body the server answers a delete with when it does not return the deleted object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": resource, "uid": uid},
    }
