"""localinfer.quant: GGUF quantization byte-identical to llama.cpp (formats/, mixes, writer)."""
