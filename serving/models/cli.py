"""`mlplane serve models` (and `python -m serving.models`): run the model server with uvicorn, REST
on --port and gRPC on --grpc-port."""

from __future__ import annotations

import os
from pathlib import Path

import click

DEFAULT_PORT = 8500
DEFAULT_GRPC_PORT = 8501


@click.command("models")
@click.option(
    "--config",
    "config_path",
    envvar="MLPLANE_MODEL_SERVER_CONFIG",
    default=None,
    help="Server YAML (serving/models/config.py); default: every platform model from the local lake.",
)
@click.option("--data-dir", default=None, help="Lake root for the default config ($MLPLANE_DATA_DIR or ./data).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, help="REST (OIP v2, /recommend, Feast API)")
@click.option("--grpc-port", default=DEFAULT_GRPC_PORT, show_default=True, help="gRPC OIP v2; 0 turns it off")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Where the models run")
@click.option(
    "--experiments",
    "experiments_file",
    envvar="MLPLANE_EXPERIMENTS",
    default=None,
    help="Experiments file (deploy/experiments.yaml): A/B variants and shadows, re-read on change",
)
@click.option(
    "--vision",
    is_flag=True,
    help="With the default config, also serve vision_captioner (champion) on /v1/chat/completions",
)
@click.option("--log-level", default="info", show_default=True)
def serve_models(
    config_path: str | None,
    data_dir: str | None,
    host: str,
    port: int,
    grpc_port: int,
    device: str | None,
    experiments_file: str | None,
    vision: bool,
    log_level: str,
) -> None:
    """Serve the registry's models over the Open Inference Protocol v2, recommendations and online features."""
    import logging

    import uvicorn

    from serving.models.config import ServerConfig
    from serving.models.protocols.app import create_app
    from serving.models.server import ModelServer

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if config_path:
        config = ServerConfig.from_yaml(config_path)
    else:
        root = data_dir or os.environ.get("MLPLANE_DATA_DIR") or str(Path.cwd() / "data")
        config = ServerConfig.local(root, vision=vision)
    if device:
        config.device = device
    if experiments_file:
        config.experiments_file = experiments_file
    server = ModelServer(config)
    app = create_app(server, grpc_port=grpc_port or None, grpc_host=host)
    click.echo(f"model server: REST http://{host}:{port}" + (f", gRPC {host}:{grpc_port}" if grpc_port else ""))
    uvicorn.run(app, host=host, port=port, log_level=log_level)
