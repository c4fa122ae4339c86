"""Compilers from the DSL to engines: polars (offline tables), Feast objects, streaming plans."""

from feature_defs.compile.feast_typechecks import skip_feast_typechecks

skip_feast_typechecks()  # before feature_defs.compile.feast imports Feast
