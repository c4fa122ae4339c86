"""Feast imported through our packages skips typeguard's import-time instrumentation of its classes
(feature_defs/compile/feast_typechecks.py), and `MLPLANE_FEAST_TYPECHECKS=1` keeps Feast as shipped:
each case in a new interpreter, as Feast's classes are instrumented once, at their first import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from feature_defs.compile.feast_typechecks import TYPECHECKS_SETTING

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# typeguard's instrumented methods make a TypeCheckMemo; Feast's own code never does
PROBE = (
    "import engines.features.feature_store, feast; "
    "print('TypeCheckMemo' in feast.FeatureView.__init__.__code__.co_names)"
)


@pytest.mark.services  # a new interpreter per case
@pytest.mark.parametrize(("setting", "instrumented"), [(None, False), ("1", True)])
def test_feast_is_instrumented_only_when_asked(setting, instrumented):
    env = {name: value for name, value in os.environ.items() if name != TYPECHECKS_SETTING}
    if setting:
        env[TYPECHECKS_SETTING] = setting
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == str(instrumented)
