"""The lake and what lands in it: ingestion, data quality, Data Docs, ground-truth release locations."""
