"""Views the platform produces itself rather than computes from a source: batch inference outputs.
Their producing asset writes the offline rows and loads them online, so online readers get them
through a feature service next to the features."""

from __future__ import annotations

from dataclasses import dataclass, field

from feature_defs.dsl import Entity
from feature_defs.entities import user


@dataclass(frozen=True)
class OutputView:
    name: str
    entity: Entity
    schema: dict[str, str] = field(hash=False)  # feature name -> dtype, as in the DSL's compiled dtypes
    service: str  # the feature service that serves this view online
    description: str
    owner: str = "ml-platform@marketplace.example"


user_recommendations = OutputView(
    name="user_recommendations",
    entity=user,
    schema={"item_ids": "int64_list", "scores": "float64_list", "model_version": "string"},
    service="recommendations",
    description="The champion personalization model's daily top-k items per active user, best first "
    "(batch inference on Ray Data)",
)

all_outputs = [user_recommendations]
