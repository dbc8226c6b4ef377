"""``label-selector-filter``: llm-d's filter of endpoints by a Kubernetes label selector.

An endpoint is kept when its labels (a pod's Kubernetes labels, or its config's ``labels``) satisfy every
``match_labels`` pair and every ``match_expressions`` requirement, as Kubernetes matches a ``LabelSelector``:
``In`` (the label is there with one of ``values``), ``NotIn`` (the label is absent or has none of them),
``Exists`` and ``DoesNotExist``. An empty selector keeps every endpoint. When no endpoint matches,
burstsched's scheduler keeps them all (its filters fail open), where llm-d would have no endpoint for the
request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from burstsched.framework import (
    CycleState,
    EndpointSnapshot,
    PluginContext,
    PluginParameters,
    SchedRequest,
    check_label_key,
    check_label_value,
)


class LabelRequirement(PluginParameters):
    """One ``matchExpressions`` entry."""

    key: str = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label is matched."
    )
    values: list[str] = Field(
        default_factory=list,
        description="For In and NotIn: at least one value; for Exists and DoesNotExist: none.",
    )

    @field_validator("key")
    @classmethod
    def _check_key(cls, key: str) -> str:
        return check_label_key(key)

    @field_validator("values")
    @classmethod
    def _check_values(cls, values: list[str]) -> list[str]:
        for value in values:
            check_label_value(value)
        return values

    @model_validator(mode="after")
    def _check_operator(self) -> Self:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"{self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"{self.operator} takes no values")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None


class LabelSelectorParameters(PluginParameters):
    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels an endpoint must carry, each with exactly this value."
    )
    match_expressions: list[LabelRequirement] = Field(
        default_factory=list, description="Requirements an endpoint's labels must all meet."
    )

    @field_validator("match_labels")
    @classmethod
    def _check_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            check_label_key(key)
            check_label_value(value)
        return labels


class LabelSelectorFilter:
    """Keeps the endpoints whose labels match the selector."""

    Parameters = LabelSelectorParameters

    def __init__(self, name: str, parameters: LabelSelectorParameters, context: PluginContext) -> None:
        self._name = name
        self._labels = tuple(parameters.match_labels.items())
        self._requirements = tuple(parameters.match_expressions)

    @property
    def name(self) -> str:
        return self._name

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every pair and every requirement."""
        return all(labels.get(k) == v for k, v in self._labels) and all(
            r.matches(labels) for r in self._requirements
        )

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        return [e for e in endpoints if self.matches(e.labels)]
