"""What a deployment is: JSON Schema, loader, semantic rules, typed model, findings. No torch, no zmq."""
