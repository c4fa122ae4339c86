"""One table of model kinds (engines/models/kinds.py): the server's settings accept exactly its names, the
server has a loader for each."""

from __future__ import annotations

import pytest

from engines.models.kinds import KINDS
from serving.models.config import ModelEntry
from serving.models.server import ModelServer


def test_the_server_loads_every_kind_and_no_other():
    assert set(ModelServer.LOADERS) == set(KINDS)


def test_the_settings_accept_every_kind_and_refuse_another_naming_the_choices():
    for kind in KINDS:
        assert ModelEntry(name="m", registry_model="m", kind=kind).kind == kind
    with pytest.raises(ValueError, match="kind must be one of .*two_tower.*not 'three_tower'"):
        ModelEntry(name="m", registry_model="m", kind="three_tower")
