"""The shared engine: sequences, block manager, scheduler, sampler, LLMEngine."""
