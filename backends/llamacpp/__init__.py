"""llama.cpp backend: the engine's scheduler and block manager driving llama.cpp's decoder
through llama-cpp-python's low-level bindings (installed with `pip install 'localinfer[llamacpp]'`).
"""
