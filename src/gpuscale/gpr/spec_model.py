"""The REST model of a GPR spec (pydantic), built from the one spec schema (:data:`gpuscale.core.gpr.SPEC_SCHEMA`).

Each row becomes a field with the row's type, bounds and patterns; the EGS aliases are accepted as validation
aliases and the ignored EGS keys as optional fields; anything else is refused. Absent and null mean the default, as
in the core reader. Patterns are matched with Python's ``re``, like the core reader and the JSON Schema validators.
The API answers with the core reader's field-level messages; this model is what it documents and what the schema
agreement test checks against the core reader and the CRD.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    create_model,
)

from gpuscale.core.gpr import SPEC_SCHEMA, SpecField
from gpuscale.core.gpr.schema import (
    LABEL_KEY_MAX,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_MAX,
    LABEL_VALUE_PATTERN,
    TEXT_PATTERN,
)


def _matching(patterns: tuple[str, ...]) -> AfterValidator:
    compiled = [re.compile(p) for p in patterns]

    def check(value: Any) -> Any:
        if isinstance(value, str):
            for rx in compiled:
                if rx.search(value) is None:
                    raise ValueError(f"does not match {rx.pattern}")
        return value

    return AfterValidator(check)


def _whole_number(value: Any) -> Any:
    """Integers as JSON has them: no booleans, no strings; a float only when it is whole."""
    if isinstance(value, bool | str):
        raise ValueError("must be an integer")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise ValueError("must be an integer")
    return value


def _label_keys(labels: dict[str, str]) -> dict[str, str]:
    rx = re.compile(LABEL_KEY_PATTERN)
    for key in labels:
        if len(key) > LABEL_KEY_MAX or rx.search(key) is None:
            raise ValueError(f"invalid label key {key[:40]!r}")
    return labels


LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_MAX), _matching((LABEL_VALUE_PATTERN,))]


class WorkloadSelectorIn(BaseModel):
    """``{matchLabels: {key: value}}``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    matchLabels: Annotated[dict[str, LabelValue], Field(max_length=32), AfterValidator(_label_keys)] = Field(
        default_factory=dict
    )


def _annotation(f: SpecField) -> Any:
    if f.kind in ("text", "duration"):
        return Annotated[str, Field(max_length=f.max_length), _matching(f.patterns)]
    if f.kind == "integer":
        return Annotated[int, BeforeValidator(_whole_number), Field(ge=f.minimum, le=f.maximum)]
    if f.kind == "boolean":
        return StrictBool
    if f.kind == "names":
        item = Annotated[str, Field(max_length=f.max_length), _matching((TEXT_PATTERN,))]
        return Annotated[list[item], Field(max_length=f.maximum)]
    return WorkloadSelectorIn


def _field(f: SpecField) -> tuple[Any, Any]:
    alias = AliasChoices(f.name, *f.aliases) if f.aliases else None
    if f.required:
        return _annotation(f), Field(validation_alias=alias, description=f.description)
    return _annotation(f) | None, Field(None, validation_alias=alias, description=f.description)


def build_spec_model() -> type[BaseModel]:
    """The pydantic model of a create body, one field per :data:`SPEC_SCHEMA` row."""
    fields: dict[str, Any] = {f.name: _field(f) for f in SPEC_SCHEMA}
    model: type[BaseModel] = create_model(
        "GprSpecIn",
        __config__=ConfigDict(extra="forbid", populate_by_name=True, str_strip_whitespace=False),
        __doc__="A GPU provisioning request spec (EGS field names).",
        **fields,
    )
    return model


GprSpecIn = build_spec_model()
"""The REST model of a GPR spec."""
