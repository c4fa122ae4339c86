"""Feast without typeguard's import-time instrumentation, unless `MLPLANE_FEAST_TYPECHECKS=1`.

Feast decorates its classes with typeguard's `@typechecked`, which re-parses and recompiles the whole
module's source once for each decorated method when the module is imported: most of the cost of
`import feast`, paid by every process that reads features (each `dagster` and `mlplane` command, the
model server, the tests' workers), plus a check on every call (agronholm/typeguard#468). The Feast
objects we pass come from the DSL's compiler, which the tests hold to Feast's own API. Typeguard is
used by no other package here.

`skip_feast_typechecks()` must run before Feast is first imported: the packages whose modules import
Feast (`feature_defs.compile`, `engines.features`) call it in their `__init__`."""

from __future__ import annotations

import os
import sys
from typing import Any

TYPECHECKS_SETTING = "MLPLANE_FEAST_TYPECHECKS"


def _unchecked(target: Any = None, **_options: Any) -> Any:
    """`typechecked` as it behaves under `python -O`: the target unchanged."""
    if target is None:  # used with options: @typechecked(...)
        return lambda decorated: decorated
    return target


def skip_feast_typechecks() -> None:
    if os.environ.get(TYPECHECKS_SETTING, "").strip().lower() in ("1", "true", "yes") or "feast" in sys.modules:
        return  # asked for, or too late: Feast already holds the instrumented classes
    import typeguard

    typeguard.typechecked = _unchecked
