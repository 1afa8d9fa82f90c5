"""The GGUF format's numbers that the reader keeps (localinfer/ggml_types.py) are the `gguf`
package's: every value type, tensor type and block size we name means what it means there."""

from __future__ import annotations

import subprocess
import sys

import gguf.constants as upstream

from localinfer import ggml_types as ours


def test_value_types_match_gguf() -> None:
    assert {m.name: m.value for m in ours.GGUFValueType} == {
        m.name: m.value for m in upstream.GGUFValueType}


def test_tensor_types_and_block_sizes_match_gguf() -> None:
    known = {m.name: m.value for m in upstream.GGMLQuantizationType}
    for m in ours.GGMLQuantizationType:  # a newer gguf may know more types than we name
        assert known.get(m.name) == m.value, m.name
        assert ours.GGML_QUANT_SIZES[m] == upstream.GGML_QUANT_SIZES[
            upstream.GGMLQuantizationType(m.value)], m.name
    # every type a model here uses, and the ones the quantizer writes
    for name in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                 "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"):
        assert name in ours.GGMLQuantizationType.__members__


def test_reading_a_gguf_does_not_import_the_gguf_package(smollm2_path) -> None:
    code = ("import sys\nfrom localinfer.gguf_file import open_gguf\n"
            f"g = open_gguf({str(smollm2_path)!r})\nassert g.tensors\n"
            "print('gguf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
