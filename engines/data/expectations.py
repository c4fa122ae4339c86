"""Expectation suites declared without importing great-expectations (about 2 s with pandas and scipy, paid
by every process that loads the Dagster definitions). `gxe.ExpectColumnValuesToNotBeNull(column="x")`
records GX's class name and arguments; the quality engine builds the GX objects when it validates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Expectation:
    """One great-expectations expectation: its class in `great_expectations.expectations` and arguments."""

    kind: str  # e.g. "ExpectColumnValuesToNotBeNull"
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def build(self):
        """The GX expectation (a new object each time: GX binds one to the suite it is added to)."""
        import great_expectations.expectations as gx_expectations

        expectation_class = getattr(gx_expectations, self.kind, None)
        if expectation_class is None:
            raise ValueError(f"great_expectations.expectations has no {self.kind}")
        return expectation_class(**self.kwargs)


class _DeferredExpectations:
    """`gxe.ExpectSomething(**kwargs)`, spelled as with `great_expectations.expectations as gxe`."""

    def __getattr__(self, kind: str):
        if not kind.startswith("Expect"):
            raise AttributeError(kind)
        return lambda **kwargs: Expectation(kind, kwargs)


gxe = _DeferredExpectations()


@dataclass(frozen=True)
class Suite:
    """A named expectation suite declared in code; the quality engine syncs it into the GX project."""

    name: str
    expectations: Sequence[Expectation]
