"""quantize_file(): read a GGUF, choose each tensor's type (mixes.py), convert it with the
Numba block formats, and write the result crash-safely (temp file, fsync, reopen, rename)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.constants import GGUFValueType

from localinfer.atomic_file import atomic_write, remove_stale_temps
from localinfer.errors import GGUFError, InvalidRequestError, UnsupportedModelError
from localinfer.gguf_file import GGUFFile, TensorInfo, open_gguf
from localinfer.progress import ProgressBar

from .formats import QuantFormat, format_for
from .formats.weighted import IGNORES_IMATRIX, WEIGHTED
from .gguf_writer import KV, GGUFStreamWriter, TensorSpec
from .mixes import ALIASES, FTYPES, NEEDS_IMATRIX, MixState, llama_order, plan_types

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")
LAYER_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
GGML_QNT_VERSION = 2
_DROP_KEYS = ("general.quantization_version", "general.file_type", "split.no", "split.count",
              "split.tensors.count")
SLAB_BYTES = 32 << 20  # float32 rows converted per step


@dataclass(slots=True)
class QuantizeReport:
    ftype: str
    tensors: list[tuple[str, str, str, int, int]] = field(default_factory=list)
    # (name, source type, target type, source bytes, target bytes)
    requantized: int = 0
    fallbacks: int = 0
    imatrix_used: int = 0  # tensors quantized with importance weights
    seconds: float = 0.0

    @property
    def src_bytes(self) -> int:
        return sum(t[3] for t in self.tensors)

    @property
    def dst_bytes(self) -> int:
        return sum(t[4] for t in self.tensors)


def resolve_ftype(name: str, has_imatrix: bool | None = None) -> str:
    """The mix name for a --type; has_imatrix False refuses the mixes that need one (None:
    not known yet, so only the name is checked)."""
    key = ALIASES.get(name.upper(), name.upper())
    if key not in FTYPES:
        choices = ", ".join([*FTYPES, *ALIASES])
        raise InvalidRequestError(f"unknown quantization type {name!r} (choose from {choices})")
    if key in NEEDS_IMATRIX and has_imatrix is False:
        raise InvalidRequestError(f"{key} needs an importance matrix (--imatrix FILE, made by "
                                  "`localinfer imatrix`)")
    return key


def _num(g: GGUFFile, key: str, default: int) -> int:
    v = g.metadata.get(f"{g.arch}.{key}", default)
    if isinstance(v, np.ndarray):  # per-layer values: llama.cpp's n_gqa() uses layer 0
        v = v[0] if v.size else default
    return int(v)


def _mix_state(g: GGUFFile, ftype: str) -> MixState:
    arch = g.arch
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(f"{g.path}: architecture {arch!r} is not supported by the "
                                    f"quantizer (supported: {', '.join(SUPPORTED_ARCHS)})")
    if _num(g, "expert_count", 0) > 1:
        raise UnsupportedModelError(f"{g.path}: mixture-of-experts models are not supported yet")
    n_layer = _num(g, "block_count", 0)
    if n_layer <= 0:
        raise GGUFError(f"{g.path}: missing or invalid {arch}.block_count")
    missing = [] if "token_embd.weight" in g.tensors else ["token_embd.weight"]
    missing += [f"blk.{i}.{t}.weight" for i in range(n_layer) for t in LAYER_TENSORS
                if f"blk.{i}.{t}.weight" not in g.tensors]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise GGUFError(f"{g.path}: missing tensor {missing[0]}{more}")
    n_head = _num(g, "attention.head_count", 0)
    n_head_kv = _num(g, "attention.head_count_kv", n_head)
    is_70b = arch == "llama" and n_layer == 80 and n_head != n_head_kv
    return MixState(ftype, n_layer, n_head // n_head_kv if n_head_kv else 0, is_70b)


def _kvs(g: GGUFFile, ftype_id: int) -> list[KV]:
    kvs = [KV(k, g.kv_types[k][0], v, g.kv_types[k][1])
           for k, v in g.metadata.items() if k not in _DROP_KEYS]
    kvs.append(KV("general.quantization_version", GGUFValueType.UINT32, GGML_QNT_VERSION))
    kvs.append(KV("general.file_type", GGUFValueType.UINT32, ftype_id))
    return kvs


def _to_f32(g: GGUFFile, info: TensorInfo, rows: slice) -> np.ndarray:
    arr = g.array(info.name)
    block = arr.reshape(-1, arr.shape[-1])[rows]
    if info.ggml_type == T.F32:
        return block
    if info.ggml_type == T.F16:
        return block.astype(np.float32)
    if info.ggml_type == T.BF16:
        return (block.astype(np.uint32) << 16).view(np.float32)
    return format_for(info.ggml_type).dequantize(block, info.shape[0])


def _validator(specs: list[TensorSpec], n_kv: int) -> Callable[[Path], None]:
    def validate(path: Path) -> None:
        with open_gguf(path) as out:
            got = [(t.name, t.shape, t.ggml_type, t.nbytes) for t in out.tensors.values()]
            want = [(s.name, s.shape, s.ggml_type, s.nbytes) for s in specs]
            if got != want or len(out.metadata) != n_kv:
                raise GGUFError(f"{path}: the written file does not read back as planned")
    return validate


def quantize_file(src: str | Path, dst: str | Path, type_name: str, *, pure: bool = False,
                  imatrix: str | Path | None = None, progress: bool | None = None,
                  warn: Callable[[str], None] | None = None) -> QuantizeReport:
    ftype = resolve_ftype(type_name, imatrix is not None)
    qweights = _load_imatrix(imatrix) if imatrix is not None else None
    src, dst = Path(src), Path(dst)
    warn = warn or (lambda msg: print(f"localinfer: warning: {msg}", file=sys.stderr))
    if dst.exists() and dst.resolve() == src.resolve():
        raise InvalidRequestError("the output file must differ from the input file")
    t0 = time.monotonic()
    with open_gguf(src) as g:
        st = _mix_state(g, ftype)
        st.has_imatrix = qweights is not None
        for info in g.tensors.values():
            format_for(info.ggml_type)  # refuses types we cannot read
        targets = plan_types(st, {n: (t.shape, t.ggml_type) for n, t in g.tensors.items()}, pure)
        names = llama_order(list(g.tensors))
        specs = [TensorSpec(n, g.tensors[n].shape, targets[n]) for n in names]
        if qweights is not None:
            _check_imatrix(g, specs, qweights, ftype)
        report = QuantizeReport(ftype, fallbacks=st.n_fallback)
        quantized_in = [n for n in names if g.tensors[n].ggml_type not in (T.F32, T.F16, T.BF16)
                        and targets[n] != g.tensors[n].ggml_type]
        if quantized_in:
            warn(f"{len(quantized_in)} tensors are already quantized; they are dequantized "
                 "first, which adds the old quantization error to the new one")
        kvs = _kvs(g, FTYPES[ftype][0])
        alignment = g.alignment
        remove_stale_temps(dst.parent)
        with atomic_write(dst, validate=_validator(specs, len(kvs))) as f:
            writer = GGUFStreamWriter(f, kvs, specs, alignment)
            total = sum(g.tensors[n].nbytes for n in names) or 1
            done = 0
            for i, spec in enumerate(specs):  # label: tensor i/n, overall % done before it
                step = f"[{i + 1:>4}/{len(specs)} {100 * done / total:3.0f}%]"
                qw = _tensor_weights(qweights, g.tensors[spec.name], spec.ggml_type)
                _write_tensor(g, g.tensors[spec.name], spec, writer, report, step, progress, qw)
                done += g.tensors[spec.name].nbytes
            writer.finish()
        report.requantized = len(quantized_in)
    report.seconds = time.monotonic() - t0
    return report


def _load_imatrix(path: str | Path) -> dict[str, np.ndarray]:
    from .imatrix import load

    return load(path).weights()


def _tensor_weights(qweights: dict[str, np.ndarray] | None, info: TensorInfo,
                    target: int) -> np.ndarray | None:
    """The importance weights llama.cpp would pass for this tensor (None: plain search)."""
    if qweights is None or target in IGNORES_IMATRIX or target == info.ggml_type:
        return None
    qw = qweights.get(info.name)
    if qw is None or qw.size != info.shape[0]:  # (token_embd: never in an imatrix)
        return None
    return np.ascontiguousarray(qw, dtype=np.float32)


def _check_imatrix(g: GGUFFile, specs: list[TensorSpec], qweights: dict[str, np.ndarray],
                   ftype: str) -> None:
    for spec in specs:
        qw = qweights.get(spec.name)
        if qw is not None and qw.size != g.tensors[spec.name].shape[0] \
                and spec.name != "token_embd.weight":
            raise InvalidRequestError(
                f"imatrix size {qw.size} is different from tensor size "
                f"{g.tensors[spec.name].shape[0]} for {spec.name} (an imatrix of another model?)")
        # llama.cpp's tensor_requires_imatrix: Q2_K_S's Q2_K tensors (not the embeddings/output)
        if qw is None and ftype in NEEDS_IMATRIX and spec.ggml_type == T.Q2_K \
                and spec.ggml_type != g.tensors[spec.name].ggml_type \
                and spec.name not in ("token_embd.weight", "output.weight"):
            raise InvalidRequestError(f"the imatrix has no entry for {spec.name}, which "
                                      f"{ftype} quantizes to Q2_K (too lossy without one)")


def _write_tensor(g: GGUFFile, info: TensorInfo, spec: TensorSpec, writer: GGUFStreamWriter,
                  report: QuantizeReport, step: str, progress: bool | None,
                  qw: np.ndarray | None = None) -> None:
    src_t, dst_t = T(info.ggml_type).name, T(spec.ggml_type).name
    label = f"{step} {info.name:<32} {src_t:>5} → {dst_t:<5}"
    if info.ggml_type == spec.ggml_type:
        writer.write_tensor(info.name, g.raw(info.name))
    else:
        fmt = format_for(spec.ggml_type)
        n_rows = info.n_elements // info.shape[0]
        step_rows = max(1, SLAB_BYTES // (4 * info.shape[0]))
        with ProgressBar(info.nbytes, label, enabled=progress) as bar:
            for r0 in range(0, n_rows, step_rows):
                rows = slice(r0, min(n_rows, r0 + step_rows))
                q = _quantize(fmt, _to_f32(g, info, rows), qw)
                writer.write_tensor(info.name, q, last_chunk=rows.stop == n_rows)
                bar.update((rows.stop - r0) * info.row_bytes)
    report.tensors.append((info.name, src_t, dst_t, info.nbytes, spec.nbytes))
    report.imatrix_used += qw is not None


def _quantize(fmt: type[QuantFormat], x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    if qw is None:
        return fmt.quantize(x)
    rows = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((rows.shape[0], fmt.row_bytes(rows.shape[1])), np.uint8)
    if rows.size:
        WEIGHTED[fmt.ggml_type](rows, out, qw)
    return out
