from dagster import ConfigurableResource
from pydantic import Field

from engines.retrieval.vector_store import VectorStore


class VectorStoreResource(ConfigurableResource):
    """The vector database: Qdrant embedded in-process over a local folder by default (the lake's
    `vectors/`), a Qdrant server by URL in production (`MLPLANE_QDRANT_URL`)."""

    location: str = Field(description="A local folder (embedded Qdrant Edge) or an http(s):// Qdrant server URL")
    allow_embedded: bool = Field(
        default=True,
        description="Whether a local folder may be used; the prod profile allows it only with MLPLANE_ALLOW_EMBEDDED",
    )

    def get_client(self) -> VectorStore:
        """Open the store; close it (or use `with`) when done: a local folder is one process's at a time."""
        if not self.allow_embedded and "://" not in self.location:
            raise ValueError(
                f"MLPLANE_QDRANT_URL={self.location!r} is a folder: this profile needs a Qdrant server URL "
                "(http(s)://host:6333), or MLPLANE_ALLOW_EMBEDDED=1 to embed a one-process store there"
            )
        return VectorStore.open(self.location)
