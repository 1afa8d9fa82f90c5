"""The Triton backend's paged attention, KV store and fused small ops against exact references
(random block tables; prefill, chunked prefill over a cached prefix, decode split over the
context, GQA, sliding window, softcap) — under the interpreter without a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from localinfer.backends.triton_cuda import attention as A
from localinfer.backends.triton_cuda import elementwise as E
from triton_env import DEVICE


def exact_attention(q, keys, vals, q_pos, scale, window=0, softcap=0.0):
    """q (T, H, D) at positions q_pos over keys/vals (L, KV, D) of positions 0..L-1."""
    t, h, d = q.shape
    group = h // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).double()  # (L, H, D)
    v = vals.repeat_interleave(group, dim=1).double()
    s = torch.einsum("thd,lhd->thl", q.double(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    kp = torch.arange(keys.shape[0])
    ok = kp[None, :] <= q_pos[:, None]
    if window:
        ok &= kp[None, :] > q_pos[:, None] - window
    s = s.masked_fill(~ok[:, None, :], float("-inf"))
    return torch.einsum("thl,lhd->thd", torch.softmax(s, -1), v).float()


def run_case(seqs, n_heads=4, n_kv=2, head_dim=16, block_size=16, window=0, softcap=0.0,
             n_splits=None, seed=0):
    """seqs: [(context_len, new_tokens)] — the new tokens are the last of the context."""
    rng = np.random.default_rng(seed)
    num_blocks = sum(-(-c // block_size) for c, _ in seqs) + 3
    k_pool = torch.from_numpy(rng.standard_normal((num_blocks, block_size, n_kv, head_dim))
                              .astype(np.float16)).to(DEVICE)
    v_pool = torch.from_numpy(rng.standard_normal(k_pool.shape).astype(np.float16)).to(DEVICE)
    free = list(rng.permutation(num_blocks))
    tables, positions, starts, expect = [], [], [0], []
    width = max(-(-c // block_size) for c, _ in seqs)
    q_all = []
    for ctx, new in seqs:
        table = [int(free.pop()) for _ in range(-(-ctx // block_size))]
        tables.append(table + [0] * (width - len(table)))
        pos = torch.arange(ctx - new, ctx)
        positions.append(pos)
        starts.append(starts[-1] + new)
        q = torch.from_numpy(rng.standard_normal((new, n_heads, head_dim)).astype(np.float32))
        q_all.append(q)
        slots = torch.tensor(table).repeat_interleave(block_size)[:ctx] * block_size + \
            torch.arange(ctx) % block_size
        keys = k_pool.reshape(-1, n_kv, head_dim)[slots.to(DEVICE)].cpu().float()
        vals = v_pool.reshape(-1, n_kv, head_dim)[slots.to(DEVICE)].cpu().float()
        expect.append(exact_attention(q, keys, vals, pos, 1 / math.sqrt(head_dim), window,
                                      softcap))
    n = starts[-1]
    qkv = torch.zeros(n, (n_heads + 2 * n_kv) * head_dim)
    qkv[:, : n_heads * head_dim] = torch.cat(q_all).reshape(n, -1)
    qkv = qkv.to(DEVICE)
    p = A.plan(np.array(starts), n_heads, n_kv, DEVICE, width, split_target=0, n_splits=n_splits)
    out = torch.full((n, n_heads * head_dim), float("nan"), device=DEVICE)
    A.attend(qkv, k_pool, v_pool, torch.tensor(tables, dtype=torch.int32, device=DEVICE),
             torch.cat(positions).to(torch.int32).to(DEVICE), p, out, n_heads,
             1 / math.sqrt(head_dim), window, softcap)
    return out.cpu().reshape(n, n_heads, head_dim), torch.cat(expect)


@pytest.mark.parametrize("case", [
    dict(seqs=[(21, 21)]),  # prefill
    dict(seqs=[(40, 9), (17, 17)]),  # chunked prefill over a cached prefix, beside a prefill
    dict(seqs=[(70, 1), (5, 1), (33, 1)]),  # decode
    dict(seqs=[(70, 1), (33, 1)], n_splits=3),  # decode split over the context, merged
    dict(seqs=[(29, 29)], n_heads=6, n_kv=2),  # GQA group of 3 (padded to 4 rows)
    dict(seqs=[(50, 50), (61, 1)], window=12),  # sliding window
    dict(seqs=[(50, 7), (61, 1)], window=20, n_splits=2),
    dict(seqs=[(30, 30), (44, 1)], softcap=2.0),
    dict(seqs=[(18, 18)], head_dim=24),  # head_dim not a power of two
])
def test_attention_matches_exact(case):
    got, want = run_case(**case)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_split_decode_equals_unsplit():
    seqs = [(150, 1), (47, 1)]
    one, _ = run_case(seqs, n_splits=1)
    four, _ = run_case(seqs, n_splits=4)
    # the same up to P's f16 rounding, which depends on each part's running maximum
    torch.testing.assert_close(one, four, atol=1e-4, rtol=0)


def test_kv_store_writes_slots_and_skips_padding():
    n_kv, hd, bs = 2, 8, 4
    qkv = torch.randn(3, (4 + 2 * n_kv) * hd, device=DEVICE)
    k_pool = torch.zeros(5, bs, n_kv, hd, dtype=torch.float16, device=DEVICE)
    v_pool = torch.zeros_like(k_pool)
    slots = torch.tensor([13, -1, 2], dtype=torch.int32, device=DEVICE)
    A.kv_store(qkv, slots, k_pool, v_pool, 4 * hd, (4 + n_kv) * hd)
    k, v = k_pool.reshape(-1, n_kv * hd).float(), v_pool.reshape(-1, n_kv * hd).float()
    for row, slot in ((0, 13), (2, 2)):
        torch.testing.assert_close(k[slot], qkv[row, 4 * hd: 6 * hd].half().float())
        torch.testing.assert_close(v[slot], qkv[row, 6 * hd:].half().float())
    assert int((k.abs().sum(1) > 0).sum()) == 2  # the padding row wrote nothing


def test_add_rmsnorm_with_and_without_post_norm():
    x = torch.randn(3, 40, device=DEVICE)
    d = torch.randn(3, 40, device=DEVICE)
    w, pw = torch.randn(40, device=DEVICE), torch.randn(40, device=DEVICE)
    eps = 1e-6

    def norm(a, wt):
        return a / torch.sqrt((a * a).mean(-1, keepdim=True) + eps) * wt

    for post in (None, pw):
        x1, out = x.clone(), torch.empty_like(x)
        E.add_rmsnorm(x1, d, w, out, eps, post=post)
        x_ref = x + (d if post is None else norm(d, pw))
        torch.testing.assert_close(x1, x_ref)
        torch.testing.assert_close(out, norm(x_ref, w))
    out = torch.empty_like(x)
    E.add_rmsnorm(x, None, w, out, eps)
    torch.testing.assert_close(out, norm(x, w))


def rope_reference(x, pos, n_heads, hd, rope_dim, base, neox, freq_scale=1.0):
    x = x.reshape(x.shape[0], n_heads, hd).double().clone()
    inv = torch.from_numpy(E.inv_freq(rope_dim, base)).double()
    theta = pos.double()[:, None] * freq_scale * inv[None, :]  # (T, rope_dim/2)
    c, s = torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :]
    half = rope_dim // 2
    if neox:
        a, b = x[..., :half].clone(), x[..., half:rope_dim].clone()
        x[..., :half], x[..., half:rope_dim] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0:rope_dim:2].clone(), x[..., 1:rope_dim:2].clone()
        x[..., 0:rope_dim:2], x[..., 1:rope_dim:2] = a * c - b * s, a * s + b * c
    return x.reshape(x.shape[0], -1).float()


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("rope_dim", [16, 8])
def test_rope_normal_and_neox(neox, rope_dim):
    n_heads, hd = 3, 16
    x = torch.randn(5, n_heads * hd + 7)  # a column offset and other columns left alone
    pos = torch.tensor([0, 1, 7, 100, 1000], dtype=torch.int32)
    got = x.clone().to(DEVICE)
    freqs = torch.from_numpy(E.inv_freq(rope_dim, 10000.0)).to(DEVICE)
    E.rope(got, 7, n_heads, hd, rope_dim, pos.to(DEVICE), freqs, neox, freq_scale=0.5)
    got = got.cpu()
    torch.testing.assert_close(got[:, :7], x[:, :7])
    want = rope_reference(x[:, 7:], pos, n_heads, hd, rope_dim, 10000.0, neox, 0.5)
    torch.testing.assert_close(got[:, 7:], want, atol=1e-4, rtol=1e-4)


def test_rope_with_per_head_norm():
    n_heads, hd, eps = 2, 16, 1e-6
    x = torch.randn(4, n_heads * hd)
    w = torch.randn(hd)
    pos = torch.tensor([3, 4, 5, 6], dtype=torch.int32)
    got = x.clone().to(DEVICE)
    freqs = torch.from_numpy(E.inv_freq(hd, 1e6)).to(DEVICE)
    E.rope(got, 0, n_heads, hd, hd, pos.to(DEVICE), freqs, True, norm=w.to(DEVICE), eps=eps)
    xh = x.reshape(4, n_heads, hd)
    normed = (xh / torch.sqrt((xh * xh).mean(-1, keepdim=True) + eps) * w).reshape(4, -1)
    want = rope_reference(normed, pos, n_heads, hd, hd, 1e6, True)
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("act", [E.ACT_SILU, E.ACT_GELU_TANH])
def test_gated_activations(act):
    gu = torch.randn(3, 2 * 48) * 4
    gu[0, 0], gu[0, 1] = 60.0, -60.0  # saturation stays finite
    out = torch.empty(3, 48, device=DEVICE)
    E.act_mul(gu.to(DEVICE), 48, out, act)
    g, u = gu[:, :48], gu[:, 48:]
    ref = (torch.nn.functional.silu(g) if act == E.ACT_SILU
           else torch.nn.functional.gelu(g, approximate="tanh")) * u
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
