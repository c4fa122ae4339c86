"""`python -m serving.gateway --config gateway.yaml`: run the gateway with uvicorn."""

from serving.gateway.cli import serve

if __name__ == "__main__":
    serve()
