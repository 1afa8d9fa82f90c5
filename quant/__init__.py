"""localinfer.quant: GGUF quantization (a later issue)."""
