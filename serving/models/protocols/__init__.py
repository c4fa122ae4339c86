"""The model server's front ends: Open Inference Protocol v2 (REST, gRPC, binary tensors), OpenAI chat, Feast."""
