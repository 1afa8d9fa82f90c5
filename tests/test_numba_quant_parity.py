"""The Numba runner on real files in every weight type, quantized by llama.cpp itself, against
llama.cpp on the same file, teacher-forced on 224 tokens plus a 16-token greedy continuation.

Two source models, both written once per module from SmolLM2 (LOCALINFER_TEST_MODEL):
- SmolLM2 dequantized to F16, then llama_model_quantize'd (default mix of each file type).
  Its 576-wide rows hold no 256-blocks, so llama.cpp falls back there (Q4_K -> Q5_0,
  IQ4_XS -> IQ4_NL, ...) and only ffn_down (1536-wide rows) gets the K-quant / IQ4_XS type.
- "SmolLM2-768": the same network zero-padded to 256-multiple widths (n_embd 576 -> 768, heads
  9 -> 12 with one all-zero head per KV group, RMSNorm weights and epsilon rescaled so it
  computes the same function: llama.cpp's KL between the two F16 files is ~3e-6), so every
  matrix gets its mix's K-quant type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
Every file runs on the host's native kernel path; a few on the plain-Numba fallback too.

Criteria.  Issue 4's are: mean KL(llama.cpp || ours) <= 5e-3, the same top-1 wherever
llama.cpp leads by >= 0.5, greedy identical up to llama.cpp's first lead < 0.5.  On this
135M model with 8-bit activations they sit at or below llama.cpp's own noise: once any float
differs by an ulp, some activation code flips and the 8-bit rounding noise of the two
computations decorrelates over the 30 layers.  So each file is also run by llama.cpp with every
attn_norm weight scaled by (1 + 1e-6) (quantized matrices bit-identical), and the criteria
become, with floor = llama.cpp's mean KL to its perturbed self and the confidence threshold
c = 0.5 * max(1, sqrt(floor / 5e-3)) (logit noise grows like sqrt(KL)): mean KL <=
max(5e-3, 2 * floor); top-1 mismatches where llama.cpp leads by >= c at most 2 x the perturbed
run's + 1; greedy first differing where llama.cpp's lead is < c or no earlier than the
perturbed run's.  Below the 5e-3 floor that is the issue's criteria (plus one allowed top-1
flip: the perturbed llama.cpp itself flips one at lead 0.78 on Q8_0).  Measured (native path): legacy types and
F16/BF16 pass the plain issue criteria (KL 2e-6 .. 3.8e-3); K-quant files have a floor of
5e-3 .. 7e-3 (SmolLM2 mixes) and ~1e-2 .. 1e-1 (768 mixes; llama.cpp's q8_K activations
carry one scale per 256), and ours lands within 0.8 .. 1.4 x of it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")
llama_cpp = pytest.importorskip("llama_cpp")

from gguf import GGUFValueType, GGUFWriter  # noqa: E402
from parity_checks import kl_per_position, lead, row_leads  # noqa: E402
from quant_fixtures import llama_quantize, write_f16_gguf  # noqa: E402
from test_numba_parity import make_batch, run_chunks  # noqa: E402

from localinfer.gguf_file import open_gguf  # noqa: E402

pytestmark = pytest.mark.slow

TEXT = (Path(__file__).parent / "data" / "parity_text.txt").read_text()
N_TOKENS = 224
PROMPT = b"The old lighthouse keeper climbed the spiral stairs"
N_GREEDY = 16

# (case id, source, llama.cpp ftype, {matrix role: ggml types the file must hold there}); every
# file uses llama.cpp's default mix for its type
CASES = [
    ("F16", "smollm2", 1, {"ffn_down": {"F16"}}),
    ("BF16", "smollm2", 32, {"ffn_down": {"BF16"}}),
    ("Q4_0", "smollm2", 2, {"ffn_down": {"Q4_0"}}),
    ("Q4_1", "smollm2", 3, {"ffn_down": {"Q4_1"}}),
    ("Q5_0", "smollm2", 8, {"ffn_down": {"Q5_0"}}),
    ("Q5_1", "smollm2", 9, {"ffn_down": {"Q5_1"}}),
    ("Q8_0", "smollm2", 7, {"ffn_down": {"Q8_0"}}),
    ("Q4_K_M", "smollm2", 15, {"ffn_down": {"Q4_K", "Q6_K"}, "attn_q": {"Q5_0"}}),
    ("IQ4_XS", "smollm2", 30, {"ffn_down": {"IQ4_XS", "Q5_K"}, "attn_q": {"IQ4_NL"}}),
    ("Q2_K-768", "padded", 10, {"attn_q": {"Q2_K"}, "ffn_up": {"Q2_K"}, "ffn_down": {"Q3_K"},
                                "attn_v": {"Q4_K"}, "token_embd.weight": {"Q6_K"}}),
    ("Q3_K_M-768", "padded", 12, {"attn_q": {"Q3_K"}, "attn_output": {"Q4_K"},
                                  "ffn_down": {"Q4_K", "Q5_K"}}),
    ("Q4_K_M-768", "padded", 15, {"attn_q": {"Q4_K"}, "ffn_down": {"Q4_K", "Q6_K"}}),
    ("Q5_K_M-768", "padded", 17, {"attn_q": {"Q5_K"}, "ffn_down": {"Q5_K", "Q6_K"}}),
    ("Q6_K-768", "padded", 18, {"*": {"Q6_K"}}),
]
GENERIC = {"Q5_1", "IQ4_XS", "Q3_K_M-768"}
RUNS = [pytest.param(case, isa, id=f"{case[0]}-{isa}")
        for case in CASES for isa in ("native", "generic") if isa == "native" or case[0] in GENERIC]


def write_padded_f16(src: Path, dst: Path) -> None:
    """src (an F16 llama GGUF) zero-padded so n_embd and n_heads * head_dim are multiples of 256:
    new embedding columns and norm weights are zero, each KV group gains all-zero query heads
    (their output columns are zero too), and since RMSNorm now averages over more (zero)
    entries, its weights are scaled by sqrt(old / new) and epsilon by old / new."""
    with open_gguf(src) as g:
        arch = g.arch
        n_embd = g.metadata[f"{arch}.embedding_length"]
        n_heads = g.metadata[f"{arch}.attention.head_count"]
        n_kv = g.metadata[f"{arch}.attention.head_count_kv"]
        hd = n_embd // n_heads
        group = n_heads // n_kv
        new_group = group
        while (n_kv * new_group * hd) % 256:
            new_group += 1
        new_embd = n_kv * new_group * hd
        assert new_embd % 256 == 0 and new_embd >= n_embd
        ratio = n_embd / new_embd
        # old head h (group h // group) -> new head (h // group) * new_group + h % group
        head_rows = np.concatenate([np.arange(hd) + ((h // group) * new_group + h % group) * hd
                                    for h in range(n_heads)])
        w = GGUFWriter(str(dst), arch)
        overrides = {f"{arch}.embedding_length": new_embd,
                     f"{arch}.attention.head_count": n_kv * new_group,
                     f"{arch}.attention.layer_norm_rms_epsilon":
                         g.metadata[f"{arch}.attention.layer_norm_rms_epsilon"] * ratio}
        for key, value in g.metadata.items():
            if key == "general.architecture":
                continue
            vtype, etype = g.kv_types[key]
            value = overrides.get(key, value)
            if vtype == GGUFValueType.ARRAY and etype != GGUFValueType.STRING:
                value = list(np.asarray(value).tolist())
            w.add_key_value(key, value, GGUFValueType(vtype),
                            None if etype is None else GGUFValueType(etype))
        for name, info in g.tensors.items():
            a = np.asarray(g.array(name)).reshape(tuple(reversed(info.shape)))
            role = name.split(".")[-2]
            if a.ndim == 1:  # norm weights
                out = np.zeros(new_embd, np.float32)
                out[:n_embd] = a * np.float32(np.sqrt(ratio))
            else:
                rows = a.shape[0]
                if role == "attn_q":
                    rows, row_at = new_embd, head_rows
                elif role in ("attn_output", "ffn_down"):
                    rows, row_at = new_embd, np.arange(n_embd)
                else:
                    row_at = np.arange(rows)
                cols = a.shape[1] if role in ("ffn_down",) else new_embd
                col_at = head_rows if role == "attn_output" else np.arange(a.shape[1])
                out = np.zeros((rows, cols), a.dtype)
                out[np.ix_(row_at, col_at)] = a
            w.add_tensor(name, out)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


@pytest.fixture(scope="module")
def sources(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("quantparity")
    f16, padded = folder / "smollm2-f16.gguf", folder / "smollm2-768-f16.gguf"
    write_f16_gguf(smollm2_path, f16)
    write_padded_f16(f16, padded)
    return {"smollm2": f16, "padded": padded}


@pytest.fixture(scope="module")
def files(sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """case id -> quantized file, made on first use (the native and generic runs share it)."""
    folder = tmp_path_factory.mktemp("quantfiles")
    made: dict[str, Path] = {}

    def get(case) -> Path:
        name, source, ftype, _ = case
        if name not in made:
            if ftype == 1:
                made[name] = sources[source]
            else:
                made[name] = folder / f"{name}.gguf"
                llama_quantize(sources[source], made[name], ftype)
        return made[name]

    return get


def perturbed_copy(path: Path, dst: Path, rel: float = 1e-6) -> Path:
    """A copy of `path` with every attn_norm weight scaled by (1 + rel): the quantized matrices
    stay bit-identical, only float rounding downstream moves — llama.cpp on it vs on `path`
    measures how far llama.cpp's own logits move under rounding-level differences."""
    import shutil

    shutil.copyfile(path, dst)
    with open_gguf(path) as g:
        spans = [(info.offset, info.n_elements) for name, info in g.tensors.items()
                 if name.endswith("attn_norm.weight")]
    data = np.memmap(dst, dtype=np.uint8, mode="r+")
    for offset, n in spans:
        w = data[offset : offset + 4 * n].view(np.float32)
        w *= np.float32(1 + rel)
    data.flush()
    del data
    return dst


def llama_outputs(path: Path) -> tuple:
    """llama.cpp's teacher-forced logits and greedy continuation (with each step's lead)."""
    ref = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=2,
                          logits_all=True, verbose=False)
    tokens = ref.tokenize(TEXT.encode(), add_bos=False, special=True)[:N_TOKENS]
    assert len(tokens) == N_TOKENS
    ref.eval(tokens)
    logits = np.array(ref.scores[:N_TOKENS], dtype=np.float32)
    prompt = ref.tokenize(PROMPT, add_bos=False, special=True)
    ref.reset()
    ref.eval(prompt)
    greedy, leads = [], []
    for _ in range(N_GREEDY):
        row = np.array(ref.scores[ref.n_tokens - 1], dtype=np.float32)
        greedy.append(int(row.argmax()))
        leads.append(lead(row))
        ref.eval([greedy[-1]])
    return tokens, logits, prompt, greedy, leads


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory):
    """Per file, computed once (only the latest kept: the runs of one case are adjacent):
    llama.cpp's outputs, and the same for llama.cpp on a rounding-level perturbed copy."""
    cache: dict[Path, tuple] = {}
    folder = tmp_path_factory.mktemp("perturbed")

    def get(path: Path) -> tuple:
        if path not in cache:
            cache.clear()
            pert = perturbed_copy(path, folder / path.name)
            cache[path] = (llama_outputs(path), llama_outputs(pert))
            pert.unlink()
        return cache[path]

    return get


def compare(ref: tuple, logits: np.ndarray, greedy: list[int], confident: float = 0.5) -> dict:
    """Parity numbers of (logits, greedy) against llama.cpp's outputs `ref`; top1_n counts the
    top-1 mismatches where llama.cpp leads by >= `confident`."""
    _, ref_logits, _, ref_greedy, leads = ref
    ref_leads = row_leads(ref_logits)
    differ = ref_logits.argmax(1) != logits.argmax(1)
    kl = kl_per_position(ref_logits, logits)
    first = next((i for i, (a, b) in enumerate(zip(greedy, ref_greedy, strict=True)) if a != b),
                 N_GREEDY)
    return {"kl": float(kl.mean()), "kl_max": float(kl.max()),
            "top1_lead": float(ref_leads[differ].max(initial=0.0)),
            "top1_n": int((differ & (ref_leads >= confident)).sum()),
            "greedy": first, "greedy_lead": leads[first] if first < N_GREEDY else 0.0}


def check_types(path: Path, expect: dict[str, set[str]]) -> None:
    """The file holds the weight types this case is meant to exercise."""
    with open_gguf(path) as g:
        by_role: dict[str, Counter] = {}
        for name, info in g.tensors.items():
            if len(info.shape) > 1:
                role = name.split(".")[-2] if name.startswith("blk.") else name
                by_role.setdefault(role, Counter())[info.type_name] += 1
    for role, types in expect.items():
        roles = by_role if role == "*" else {role: by_role[role]}
        for r, got in roles.items():
            assert set(got) == types, f"{path.name}: {r} holds {dict(got)}, expected {types}"


@pytest.mark.parametrize(("case", "isa"), RUNS)
def test_quantized_file_matches_llama_cpp(case, isa, files, references) -> None:
    from localinfer.backends.numba_cpu.isa import resolve_isa
    from localinfer.backends.numba_cpu.runner import NumbaModelRunner

    from localinfer.model_config import ModelConfig

    isa = resolve_isa("auto") if isa == "native" else "generic"
    path = files(case)
    check_types(path, case[3])
    ref, pert = references(path)
    tokens, _, prompt, _, _ = ref
    g = open_gguf(path)
    runner = NumbaModelRunner(g, ModelConfig.from_gguf(g), num_blocks=24, block_size=16,
                              threads=2, isa=isa)
    try:
        assert runner.isa == isa
        logits = run_chunks(runner, tokens, [160, N_TOKENS - 160], list(range(16)))
        greedy, pos, nxt = [], 0, prompt
        for _ in range(N_GREEDY):  # prefill, then one decode step per token
            row = runner.execute(make_batch([(nxt, pos, list(range(16, 20)))]))[-1]
            pos += len(nxt)
            nxt = [int(row.argmax())]
            greedy.append(nxt[0])
    finally:
        runner.close()
        g.close()
    floor_kl = compare(ref, pert[1], pert[3])["kl"]
    # logit noise grows like sqrt(KL): "confident" scales with it above the 5e-3 floor
    confident = 0.5 * max(1.0, float(np.sqrt(floor_kl / 5e-3)))
    ours = compare(ref, logits, greedy, confident)
    floor = compare(ref, pert[1], pert[3], confident)
    fmt = ("mean KL {kl:.2e} (max {kl_max:.2e}), top-1 differs at leads <= {top1_lead:.2f} "
           f"({{top1_n}} at >= {confident:.2f}), greedy identical for {{greedy}} (lead there "
           "{greedy_lead:.2f})")
    print(f"PARITY {case[0]} {isa}: ours " + fmt.format(**ours))
    print(f"PARITY {case[0]} {isa}: llama.cpp perturbed " + fmt.format(**floor))
    assert ours["kl"] <= max(5e-3, 2 * floor["kl"]), "mean KL"
    assert ours["top1_n"] <= 2 * floor["top1_n"] + 1, "top-1 differs where llama.cpp is confident"
    if ours["greedy"] < N_GREEDY:
        assert ours["greedy_lead"] < confident or ours["greedy"] >= floor["greedy"], "greedy"
