"""localinfer.backends: ModelRunner implementations, imported lazily through localinfer.backend."""
