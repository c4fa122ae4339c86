"""The model server's `item_search`: a CLIP version's own index of the catalogue (dense and keyword
vectors) searched as `mlplane search` does, over a simulated day and the compact CLIP config with random
weights (so only the keyword branch can find an item by its title)."""

import json
from datetime import date

import numpy as np
import polars as pl
import pytest
import torch

from engines.data.lake import Lake
from ml.clip import COMPACT_MODEL, ClipSpec, load_model
from serving.models.config import ServerConfig
from serving.models.kinds.search import ItemSearchModel
from serving.models.protocols.protocol import ProtocolError
from simulator import simulate

DAY = date(2026, 1, 1)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("item_search")
    simulate(root / "lake", 1, seed=3, start_date=DAY, scale=0.05)
    lake = Lake(root / "lake")
    items = pl.read_parquet(root / "lake" / "landing" / "items" / "*" / "*.parquet")
    lake.write_partition("warehouse", "items", DAY, items)  # as ingestion would: the catalogue
    folder = root / "clip-v1"
    folder.mkdir()
    torch.manual_seed(0)
    torch.save(load_model(ClipSpec(COMPACT_MODEL)).state_dict(), folder / "clip.pt")
    (folder / "clip.json").write_text(json.dumps({"model_name": COMPACT_MODEL}))
    model = ItemSearchModel(folder, lake, str(folder / "index"), "1")
    yield model, items.sort("updated_at").unique("item_id", keep="last").sort("item_id")
    model.close()


def test_item_search_finds_items_by_title_with_filters(served):
    model, items = served
    assert model.parameters()["catalogue_items"] == items.height and model.parameters()["hybrid"]
    unique = items.group_by("title").len().filter(pl.col("len") == 1)["title"]
    targets = items.filter(pl.col("title").is_in(unique.implode())).head(5)
    texts = np.array([t.encode() for t in targets["title"]], dtype=object)
    out = model.infer({"text": texts}, {"k": 3})
    assert out["item_id"].shape == (5, 3) and out["score"].dtype == np.float32
    assert out["item_id"][:, 0].tolist() == targets["item_id"].to_list()
    target = targets.row(0, named=True)
    cheaper = model.infer({"text": texts[:1]}, {"k": 50, "price_max": target["price"] - 0.01})["item_id"][0]
    prices = dict(zip(items["item_id"], items["price"]))
    assert target["item_id"] not in cheaper and all(prices[i] < target["price"] for i in cheaper if i >= 0)
    other = next(c for c in items["category"].unique() if c != target["category"])
    in_other = model.infer({"text": texts[:1]}, {"k": 5, "category": other})["item_id"][0]
    assert all(items.filter(pl.col("item_id") == i)["category"][0] == other for i in in_other if i >= 0)


def test_item_search_refuses_bad_parameters_and_pads_short_answers(served):
    model, items = served
    with pytest.raises(ProtocolError, match="parameter 'k'"):
        model.infer({"text": np.array([b"a hat"], dtype=object)}, {"k": 0})
    with pytest.raises(ProtocolError, match="text query is empty"):
        model.infer({"text": np.array([b"  "], dtype=object)}, {})
    one = items.row(0, named=True)
    out = model.infer({"text": np.array([one["title"].encode()], dtype=object)}, {"k": 100, "price_max": 0.0})
    assert (out["item_id"] == -1).all() and np.isnan(out["score"]).all()  # no item costs nothing


def test_the_local_server_serves_item_search_from_clip():
    entries = {m.name: m for m in ServerConfig.local("/tmp/lake").models}
    assert entries["item_search"].kind == "item_search" and entries["item_search"].registry_model == "clip"
