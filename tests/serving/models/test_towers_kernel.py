"""The numpy user tower (serving/models/kinds/towers.py UserTowerKernel) against the torch network it mirrors,
on random rows of every kind (unknown categories, empty and padded histories, missing values), for
batch sizes from one row up."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.models.kinds.towers import TwoTowerModel
from tests.serving.models.conftest import tiny_two_tower


def random_columns(spec, rows: int, rng: np.random.Generator) -> dict[str, list]:
    def ids(count: int) -> list[int]:  # inside the trained id range, and far outside it (unseen)
        return np.where(rng.random(count) < 0.5, rng.integers(-2, 20, count), rng.integers(0, 10**9, count)).tolist()

    columns: dict[str, list] = {spec.id_column: ids(rows)}
    for c in spec.numeric:
        columns[c] = [None if rng.random() < 0.2 else float(v) for v in rng.normal(0, 50, rows)]
    for c, values in spec.categorical.items():
        choices = [*values, "never-seen", None]
        columns[c] = [choices[i] for i in rng.integers(0, len(choices), rows)]
    for c in spec.histories:
        columns[c] = [ids(int(rng.integers(0, 15))) for _ in range(rows)]
    return columns


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_numpy_kernel_gives_the_torch_networks_vectors(seed):
    model = tiny_two_tower(seed)
    with torch.no_grad():  # every weight random, the per-id terms too (training starts those at zero)
        for parameter in model.network.parameters():
            parameter.normal_(0.0, 0.5)
        # every item of a history in some category, or none (the pooled category shares)
        lookup = model.network.user_tower.item_category
        lookup.random_(0, model.network.user_tower.categories_of_history)
    served = TwoTowerModel(model, None, "personalization_ranking")
    rng = np.random.default_rng(seed)
    for rows in (1, 2, 7, 64):
        columns = random_columns(served.model.spec.user, rows, rng)
        ours, torch_path = served.user_vectors(columns), served.torch_user_vectors(columns)
        assert ours.dtype == np.float32 and ours.shape == torch_path.shape == (rows, served.outputs[0].shape[1])
        np.testing.assert_allclose(ours, torch_path, rtol=1e-5, atol=1e-5)  # float32 sums of terms ~1
        assert np.all(ours[:, -1] == 1.0)  # the constant that meets the item tower's bias
