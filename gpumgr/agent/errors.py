"""A refusal the device plugins turn into a gRPC status."""

from __future__ import annotations

import grpc


class PluginError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "error"):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason  # short label for the failure metric

    @classmethod
    def invalid(cls, message: str) -> PluginError:
        return cls(grpc.StatusCode.INVALID_ARGUMENT, message, "invalid")

    @classmethod
    def precondition(cls, message: str, reason: str = "precondition") -> PluginError:
        return cls(grpc.StatusCode.FAILED_PRECONDITION, message, reason)

    @classmethod
    def exhausted(cls, message: str) -> PluginError:
        return cls(grpc.StatusCode.RESOURCE_EXHAUSTED, message, "no_fit")
