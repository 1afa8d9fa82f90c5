"""Hugging Face model directory -> GGUF (llama, qwen2, gemma3): safetensors reader, tensor names and
Q/K permutation, tokenizer.json / SentencePiece metadata."""

from .converter import convert_hf_dir, is_hf_dir

__all__ = ["convert_hf_dir", "is_hf_dir"]
