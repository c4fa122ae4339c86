"""The online model server: the Open Inference Protocol v2 over the registry's models, real-time
recommendations and online features over HTTP. Plain Python, no Dagster."""
