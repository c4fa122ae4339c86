"""Triton Python-backend model around the TorchScript file beside it: engines/models/model_export.py copies this file
as `<model>/<version>/model.py`, and `configs/python_cpu.pbtxt` selects it (`tritonserver --model-config-name
python_cpu`) where the server has no libtorch backend. It runs the same model.pt the libtorch backend would:
the inputs as config.pbtxt declares them, one Dict[str, Tensor] argument for the towers (keyed by the input
names) or the single tensor for the encoders, and the first declared output.

It runs inside Triton's Python stub, not in mlplane's environment: it imports nothing of ours, and takes
torch from the site-packages the config names (the stub starts with its own interpreter's path).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        site_packages = parameters.get("site_packages", "")
        if site_packages and Path(site_packages).is_dir() and site_packages not in sys.path:
            sys.path.append(site_packages)
        import torch

        folder = Path(args["model_repository"]) / args["model_version"]
        self.script = torch.jit.load(str(folder / "model.pt"), map_location="cpu").eval()
        self.dict_input = parameters.get("torchscript_input") == "dict"
        self.inputs = [(spec["name"], _row_shape(spec)) for spec in config["input"]]
        self.output = config["output"][0]["name"]

    def execute(self, requests: list) -> list:
        """The requests Triton's dynamic batcher grouped, run as one batch and split back per request."""
        import numpy as np
        import torch

        pb_utils = importlib.import_module("triton_python_backend_utils")  # the stub's own, no package of ours

        try:
            columns: dict[str, list] = {name: [] for name, _ in self.inputs}
            sizes = []
            for request in requests:
                for name, shape in self.inputs:
                    array = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                    columns[name].append(array.reshape(len(array), *shape))
                sizes.append(len(columns[self.inputs[0][0]][-1]))
            tensors = {name: torch.from_numpy(np.concatenate(parts)) for name, parts in columns.items()}
            with torch.inference_mode():
                out = self.script(tensors if self.dict_input else tensors[self.inputs[0][0]]).numpy()
        except Exception as error:  # a bad request fails its batch with the reason, not the model
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(error).__name__}: {error}"))] * len(
                requests
            )
        bounds = np.cumsum([0, *sizes])
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(self.output, out[start:end])])
            for start, end in zip(bounds[:-1], bounds[1:])
        ]


def _row_shape(spec: dict) -> tuple[int, ...]:
    """A row's shape as the model reads it: the reshape where the config has one (ids: [1] -> []), else dims."""
    if "reshape" in spec:
        return tuple(int(d) for d in spec["reshape"].get("shape", []))
    return tuple(int(d) for d in spec["dims"])
