from dagster import ConfigurableResource
from pydantic import Field

from engines.vector_store import VectorStore


class VectorStoreResource(ConfigurableResource):
    """The vector database: Qdrant embedded in-process over a local folder by default (the lake's
    `vectors/`), a Qdrant server by URL in production (`MLPLANE_QDRANT_URL`)."""

    location: str = Field(description="A local folder (embedded Qdrant Edge) or an http(s):// Qdrant server URL")

    def get_client(self) -> VectorStore:
        """Open the store; close it (or use `with`) when done: a local folder is one process's at a time."""
        return VectorStore.open(self.location)
