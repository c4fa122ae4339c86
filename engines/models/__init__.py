"""The model registry, exports (Triton, KServe), batch inference and LLM batch work on Ray."""
