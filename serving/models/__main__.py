"""`python -m serving.models [--config server.yaml]`: run the model server."""

from serving.models.cli import serve_models

if __name__ == "__main__":
    serve_models()
