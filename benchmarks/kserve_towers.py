"""The personalization user tower served by KServe's own Python model server (`kserve.Model` and
`ModelServer`), the peer of benchmarks/online_serving.py. Runs in `.venv-kserve` (KServe's pins):

  .venv-kserve/bin/python benchmarks/kserve_towers.py --model_dir DIR --http_port 8600
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kserve  # noqa: E402
from kserve import InferOutput, InferRequest, InferResponse  # noqa: E402

from ml.personalization import PersonalizationModel  # noqa: E402


class UserTower(kserve.Model):
    def __init__(self, name: str, model_dir: str):
        super().__init__(name)
        self.model_dir = model_dir
        self.load()

    def load(self) -> bool:
        import torch

        torch.set_num_threads(1)
        self.model = PersonalizationModel.load(Path(self.model_dir))
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        spec = self.model.spec.user
        arrays = {i.name: i.as_numpy() for i in payload.inputs}
        columns = {spec.id_column: arrays[spec.id_column].tolist()}
        columns |= {c: arrays[c].astype(float).tolist() for c in spec.numeric}
        columns |= {
            c: [v.decode() if isinstance(v, bytes) else str(v) for v in arrays[c].tolist()] for c in spec.categorical
        }
        columns |= {c: [[i for i in row if i >= 0] for row in arrays[c].tolist()] for c in spec.histories}
        types = {
            spec.id_column: pl.Int64,
            **{c: pl.Float64 for c in spec.numeric},
            **{c: pl.String for c in spec.categorical},
            **{c: pl.List(pl.Int64) for c in spec.histories},
        }
        vectors = self.model.user_vectors(pl.DataFrame(columns, schema=types)).astype(np.float32)
        output = InferOutput(name="user_vector", shape=list(vectors.shape), datatype="FP32")
        output.set_data_from_numpy(vectors, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id or uuid.uuid4().hex)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--model_dir", required=True)
    args, _ = parser.parse_known_args()
    kserve.ModelServer(workers=1).start([UserTower("personalization", args.model_dir)])
