"""Untrained personalization networks for tests that need scores which tell users and items apart.

ml.personalization starts the user tower's output layers at zero, so an untrained network scores every
item by its prior alone: every user gets the same list, and items of equal prior tie."""

import torch

from ml.personalization import TwoTower


def with_drawn_outputs(network: TwoTower, std: float = 0.3) -> TwoTower:
    """`network` with its zero-started user output layers drawn at random (torch's generator: seed it)."""
    with torch.no_grad():
        for layer in (network.user_tower.mlp[2], network.user_tower.taste):
            if layer is not None:
                layer.weight.normal_(0.0, std)
                layer.bias.normal_(0.0, std)
    return network
