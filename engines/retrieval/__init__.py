"""Embeddings, the vector database, hybrid search, geometry and CLIP's registry lifecycle."""
