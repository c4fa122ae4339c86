"""Model code in plain Python (no Dagster): architectures, training loops, metrics."""
