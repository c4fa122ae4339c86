"""Every resource that hands out a client does it the same way: `resource.get_client()` (Dagster's own
resources use that name), so a reader never has to remember `.lake()`, `.engine()` or `.open()`."""

import importlib
import inspect
import pkgutil

from dagster import ConfigurableResource

import resources


def resource_classes() -> list[type]:
    found = []
    for module_info in pkgutil.iter_modules(resources.__path__):
        module = importlib.import_module(f"resources.{module_info.name}")
        found += [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, ConfigurableResource) and cls.__module__ == module.__name__
        ]
    return found


def test_clients_come_from_get_client():
    classes = resource_classes()
    assert len(classes) >= 8
    for cls in classes:
        own = {name for name, member in vars(cls).items() if inspect.isfunction(member) and not name.startswith("_")}
        accessors = {name for name in own if name in {"lake", "engine", "registry", "open", "client"}}
        assert not accessors, f"{cls.__name__} hands out its client as {accessors}; call it get_client"
    with_client = {cls.__name__ for cls in classes if "get_client" in vars(cls)}
    assert {
        "LakeResource",
        "FeatureStoreResource",
        "QualityResource",
        "ModelRegistryResource",
        "VectorStoreResource",
        "LabelStoreResource",
    } <= with_client, with_client
