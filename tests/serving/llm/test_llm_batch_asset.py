"""The batch LLM asset `llm/item_descriptions` against the real gateway and vLLM backends: a day with
blank descriptions (as an upstream system may deliver them) is described, written, checked and
recorded in the gateway's usage under the service key."""

from __future__ import annotations

import time

import polars as pl
import pytest
from dagster import AssetSelection, DagsterInstance, materialize

from assets import all_assets
from assets.llm_batch import ITEM_DESCRIPTIONS
from engines.data.lake import Lake
from feature_defs.sources import items
from orchestration.profiles import resources_for
from resources.gateway import GatewayResource
from serving.gateway.store import KEY_PREFIX
from tests.conftest import FIRST_DAY
from tests.serving.conftest import ROLLED

pytestmark = pytest.mark.services


def test_item_descriptions_through_the_gateway(llm_deployments, gateway_llm_lake, tmp_path):
    gateway, _ = llm_deployments  # a real gateway over vLLM, its backends run by the rollout controller
    import shutil

    data_dir = tmp_path / "lake"
    shutil.copytree(gateway_llm_lake / "warehouse", data_dir / "warehouse")
    lake = Lake(data_dir)
    day_items = lake.read_partition("warehouse", items.name, FIRST_DAY)
    blank_ids = sorted(day_items["item_id"].unique().to_list())[:5]
    blanked = day_items.with_columns(
        pl.when(pl.col("item_id").is_in(blank_ids[:3]))
        .then(pl.lit(""))
        .when(pl.col("item_id").is_in(blank_ids[3:]))
        .then(pl.lit(None, pl.String))
        .otherwise(pl.col("description"))
        .alias("description")
    )
    lake.write_partition("warehouse", items.name, FIRST_DAY, blanked)
    key = gateway.key(models=[ROLLED])
    resources = {
        **resources_for("local", data_dir=str(data_dir)),
        "gateway": GatewayResource(url=gateway.url, api_key=key),
    }
    result = materialize(
        all_assets,
        selection=AssetSelection.assets(ITEM_DESCRIPTIONS),
        resources=resources,
        instance=DagsterInstance.ephemeral(),
        partition_key=FIRST_DAY.isoformat(),
        run_config={
            "ops": {"llm__item_descriptions": {"config": {"model": ROLLED, "max_tokens": 12, "min_tokens": 2}}}
        },
    )
    assert result.success
    (check,) = result.get_asset_check_evaluations()
    assert check.passed, check.metadata
    written = lake.read_partition("llm", "item_descriptions", FIRST_DAY)
    # recomputed from the delivered rows: newest version of each item, description null or blank
    newest = blanked.sort("updated_at").unique("item_id", keep="last")
    expected = sorted(newest.filter(pl.col("description").fill_null("").str.strip_chars() == "")["item_id"])
    assert sorted(written["item_id"].to_list()) == expected and set(blank_ids) >= set(expected) and expected
    assert written["error"].null_count() == len(written)
    assert all(d.strip() for d in written["description"].to_list())
    metadata = result.asset_materializations_for_node("llm__item_descriptions")[0].metadata
    assert metadata["items"].value == len(expected) and metadata["items_per_s"].value > 0
    # the gateway recorded each call under the service key, with the tokens the table holds
    key_id = key.removeprefix(KEY_PREFIX).split("-")[0]
    for _ in range(100):  # usage is written off the request path
        rows = gateway.admin("GET", "/admin/usage", params={"group_by": "key_id,status"}).json()["data"]
        mine = [r for r in rows if r["key_id"] == key_id]
        if sum(r["requests"] for r in mine) >= len(expected):
            break
        time.sleep(0.2)
    assert [(r["status"], r["requests"]) for r in mine] == [(200, len(expected))]
    assert mine[0]["completion_tokens"] == written["completion_tokens"].sum()
    assert mine[0]["prompt_tokens"] == written["prompt_tokens"].sum()
