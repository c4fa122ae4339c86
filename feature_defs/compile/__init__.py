"""Compilers from the DSL to engines: polars (offline tables), Feast objects, streaming plans."""
