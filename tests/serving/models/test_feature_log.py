"""The served-features sampler respects the model card's consent (issue 42): only answers of a model
version registered with mlplane.log_inputs=true are written, each row carrying that consent; answers
of versions without it are counted and never reach the lake. The consent is the registry's tag, set at
registration and read back from a real (local MLflow) registry."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl

from engines.models.registry import LOG_INPUTS_TAG, ModelRegistry
from serving.models.hooks.feature_log import CONSENT, FeatureLog
from serving.models.kinds.recommend import Answer
from tests.serving.models.conftest import tiny_two_tower


def answer(request_id: str, model_name: str, log_inputs: bool, clicks: float) -> Answer:
    return Answer(
        request_id=request_id,
        user_id=7,
        k=3,
        context={},
        variant="",
        model_name=model_name,
        model_version="1",
        feature_service="personalization_ranking",
        item_ids=[10, 11, 12],
        scores=[0.3, 0.2, 0.1],
        features={"user_engagement__clicks_7d": clicks, "user_profile__region": "eu"},
        served_at=datetime(2026, 12, 7, 12, 0, tzinfo=UTC),
        log_inputs=log_inputs,
    )


def test_only_answers_of_consenting_models_are_written_with_their_consent(tmp_path):
    log = FeatureLog(tmp_path, sample=1.0, flush_interval_s=3600, seed=1)
    try:
        served = [answer(f"consented-{i}", "consenting", True, float(i)) for i in range(3)]
        served += [answer(f"refused-{i}", "silent", False, float(i)) for i in range(2)]
        for one in served:
            log(one)
        written = pl.read_parquet(log.flush())
    finally:
        log.close()
    assert written["request_id"].to_list() == ["consented-0", "consented-1", "consented-2"]
    assert set(written["consent"]) == {CONSENT} and CONSENT == f"{LOG_INPUTS_TAG}=true"
    assert [json.loads(f) for f in written["features"]] == [s.features for s in served[:3]]
    assert log.without_consent == 2
    assert not list(tmp_path.rglob("*silent*"))  # and nothing else under the lake holds them
    assert sum(pl.read_parquet(p).height for p in tmp_path.rglob("part-*.parquet")) == 3


def test_a_model_without_consent_leaves_the_lake_empty(tmp_path):
    log = FeatureLog(tmp_path, sample=1.0, flush_interval_s=3600)
    for i in range(5):
        log(answer(f"r{i}", "silent", False, 1.0))
    log.close()
    assert log.without_consent == 5 and not list(tmp_path.rglob("*.parquet"))


def test_the_consent_is_the_tag_set_at_registration(tmp_path):
    registry = ModelRegistry.local(tmp_path / "registry")
    folder = tiny_two_tower(seed=1).save(tmp_path / "tower")
    tags = {"mlplane.feature_service": "personalization_ranking"}
    consenting = registry.register("personalization", folder, tags, {}, log_inputs=True)
    unsaid = registry.register("personalization", folder, tags, {})
    refusing = registry.register("personalization", folder, tags, {}, log_inputs=False)
    read = {v: registry.get("personalization", v) for v in (consenting.version, unsaid.version, refusing.version)}
    assert [read[v].log_inputs for v in (consenting.version, unsaid.version, refusing.version)] == [True, False, False]
    assert read[consenting.version].tags[LOG_INPUTS_TAG] == "true" and LOG_INPUTS_TAG not in read[unsaid.version].tags
