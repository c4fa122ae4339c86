"""Model code: plain Python and torch, no Dagster."""
