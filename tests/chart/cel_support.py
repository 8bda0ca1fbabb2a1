"""Evaluate the chart's CEL (admission policies, webhook matchConditions, DeviceClass selectors) with cel-python,
the way the API server binds the variables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import celpy


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    """The value of `expression`; raises CelError when it does not compile or fails to evaluate."""
    env = celpy.Environment()
    try:
        program = env.program(env.compile(expression))
        result = program.evaluate({name: to_cel(value) for name, value in activation.items()})
    except celpy.CELParseError as error:
        raise CelError(f"does not compile: {expression}: {error}") from None
    except celpy.CELEvalError as error:
        raise CelError(f"fails: {expression}: {error}") from None
    if isinstance(result, celpy.CELEvalError):
        raise CelError(f"fails: {expression}: {result}")
    if isinstance(result, celpy.celtypes.BoolType):
        return bool(result)
    return result


def to_cel(value: Any) -> Any:
    return value if isinstance(value, celpy.celtypes.MapType) else celpy.json_to_cel(value)


def admission_request(
    user: str,
    operation: str,
    resource: str,
    group: str = "",
    sub_resource: str = "",
    node: str | None = None,
) -> dict[str, Any]:
    """request as a ValidatingAdmissionPolicy sees it; `node` is the node a pod-bound token carries."""
    extra = {"authentication.kubernetes.io/node-name": [node]} if node is not None else {}
    request: dict[str, Any] = {
        "operation": operation,
        "userInfo": {"username": user, "extra": extra},
        "resource": {"group": group, "version": "v1", "resource": resource},
    }
    if sub_resource:  # the real API server leaves subResource out when there is none (never "")
        request["subResource"] = sub_resource
    return request


def run_policy(policy: dict[str, Any], request: dict[str, Any], obj: Any, old: Any) -> Verdict:
    """What a ValidatingAdmissionPolicy decides: not matched, or allowed, or denied with the failed messages."""
    spec = policy["spec"]
    activation: dict[str, Any] = {"request": request, "object": obj, "oldObject": old}
    for condition in spec.get("matchConditions", []):
        if evaluate(condition["expression"], activation) is not True:
            return Verdict(matched=False)
    variables: dict[str, Any] = {}
    for variable in spec.get("variables", []):
        variables[variable["name"]] = evaluate(variable["expression"], {**activation, "variables": variables})
    activation["variables"] = variables
    denied = []
    for validation in spec["validations"]:
        if evaluate(validation["expression"], activation) is not True:
            message = validation.get("message") or ""
            if "messageExpression" in validation:
                message = str(evaluate(validation["messageExpression"], activation))
            denied.append(message)
    return Verdict(matched=True, denied=denied)


class CelError(AssertionError):
    """A CEL expression of the chart that does not compile or evaluate."""


@dataclass(frozen=True)
class Verdict:
    matched: bool
    denied: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.denied
