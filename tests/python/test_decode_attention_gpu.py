"""Decode attention through PyTorch on a GPU: tessel.decode_attention (contiguous and paged
caches, GQA, several new tokens), append_kv and mla_decode against torch SDPA (float64, math
backend) on the gathered caches. Skipped without a CUDA GPU or torch; TESSEL_REQUIRE_GPU=1
turns the skip into a failure."""

import math
import os

import pytest

import tessel


def _missing():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if tessel.cuda_device_count() == 0 or not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


_reason = _missing()
if _reason is not None:
    if os.environ.get("TESSEL_REQUIRE_GPU", "") not in ("", "0"):
        pytest.fail(f"TESSEL_REQUIRE_GPU is set but {_reason}", pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOL = {torch.bfloat16: dict(atol=1e-2, rtol=2e-2), torch.float16: dict(atol=2e-3, rtol=4e-3)}


def sdpa_reference(q, k, v, seqlens, scale, softcap=0.0):
    """q (B, Sq, Hq, D), k/v (B, S, Hkv, Dk/Dv) contiguous (gathered); float64 result."""
    B, Sq, Hq, _ = q.shape
    Hkv = k.shape[2]
    out = torch.empty(B, Sq, Hq, v.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(seqlens[b])
        qb = q[b].double().transpose(0, 1)  # (Hq, Sq, D)
        kb = k[b, :n].double().transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        vb = v[b, :n].double().transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        pos = torch.arange(n, device=q.device)
        mask = pos[None, :] <= (n - Sq + torch.arange(Sq, device=q.device))[:, None]
        if softcap > 0:
            s = scale * qb @ kb.transpose(-1, -2)
            s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~mask, float("-inf"))
            o = torch.softmax(s, -1) @ vb
        else:
            o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        out[b] = o.transpose(0, 1)
    return out


def paged(cache, page_size):
    """cache (B, S, H, D) -> shuffled pages (P, page_size, H, D) and block_table (B, S/ps)."""
    B, S = cache.shape[:2]
    mp = S // page_size
    perm = torch.randperm(B * mp, device=cache.device)
    pages = torch.empty(B * mp, page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
    pages[perm] = cache.reshape(B * mp, page_size, *cache.shape[2:])
    return pages, perm.reshape(B, mp).to(torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [0, 16, 64])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (16, 2)])
@pytest.mark.parametrize("sq", [1, 3])
def test_decode_vs_sdpa(dtype, page_size, hq, hkv, sq):
    B, D, S = 4, 128, 1024
    lens = torch.tensor([3, 17, 1000, 1024], dtype=torch.int32, device="cuda")
    q = torch.randn(B, sq, hq, D, device="cuda", dtype=dtype)
    k = torch.randn(B, S, hkv, D, device="cuda", dtype=dtype)
    v = torch.randn(B, S, hkv, D, device="cuda", dtype=dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, sq, hq), float("nan"), device="cuda")
    if page_size:
        kp, bt = paged(k, page_size)
        vp = torch.empty_like(kp)
        vp[bt.reshape(-1).long()] = v.reshape(-1, page_size, hkv, D)
        tessel.decode_attention(q, kp, vp, lens, out, lse=lse, block_table=bt)
    else:
        tessel.decode_attention(q, k, v, lens, out, lse=lse)
    ref = sdpa_reference(q, k, v, lens, 1 / math.sqrt(D))
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])
    assert torch.isfinite(lse).all()


def test_softcap_and_splits():
    B, hq, hkv, D, S = 2, 8, 2, 64, 700
    lens = torch.tensor([700, 9], dtype=torch.int32, device="cuda")
    q = 3 * torch.randn(B, 2, hq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, S, hkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    tessel.decode_attention(q, k, v, lens, out, softcap=20.0, num_splits=5, scale=0.2)
    torch.testing.assert_close(out.double(), sdpa_reference(q, k, v, lens, 0.2, 20.0),
                               **TOL[torch.bfloat16])
    # max_seqlen only plans the splits: a hint far below the real lengths changes nothing
    out.fill_(float("nan"))
    tessel.decode_attention(q, k, v, lens, out, softcap=20.0, scale=0.2, max_seqlen=64)
    torch.testing.assert_close(out.double(), sdpa_reference(q, k, v, lens, 0.2, 20.0),
                               **TOL[torch.bfloat16])


def test_append_then_decode_paged():
    B, hq, hkv, D, ps, mp = 3, 8, 2, 128, 16, 8
    lens = torch.tensor([5, 100, 128], dtype=torch.int32, device="cuda")
    k = torch.randn(B, ps * mp, hkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    kp, bt = paged(k.clone(), ps)
    vp = torch.empty_like(kp)
    vp[bt.reshape(-1).long()] = v.reshape(-1, ps, hkv, D)
    kn = torch.randn(B, 2, hkv, D, device="cuda", dtype=torch.bfloat16)
    vn = torch.randn_like(kn)
    tessel.append_kv(kn, vn, kp, vp, lens, block_table=bt, check_inputs=True)
    for b in range(B):
        n = int(lens[b])
        k[b, n - 2:n] = kn[b]
        v[b, n - 2:n] = vn[b]
    q = torch.randn(B, 2, hq, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    tessel.decode_attention(q, kp, vp, lens, out, block_table=bt)
    torch.testing.assert_close(out.double(), sdpa_reference(q, k, v, lens, D ** -0.5),
                               **TOL[torch.bfloat16])


@pytest.mark.parametrize("heads", [16, 128])
def test_mla_decode(heads):
    B, S, ps = 2, 512, 64
    lens = torch.tensor([77, 512], dtype=torch.int32, device="cuda")
    ql = torch.randn(B, 1, heads, 512, device="cuda", dtype=torch.bfloat16) / 4
    qr = torch.randn(B, 1, heads, 64, device="cuda", dtype=torch.bfloat16) / 4
    cache = torch.randn(B, S, 1, 576, device="cuda", dtype=torch.bfloat16)
    pages, bt = paged(cache, ps)
    out = torch.empty(B, 1, heads, 512, device="cuda", dtype=torch.bfloat16)
    scale = 192 ** -0.5
    tessel.mla_decode(ql, qr, pages.reshape(-1, ps, 576), lens, out, block_table=bt, scale=scale)
    ref = sdpa_reference(torch.cat([ql, qr], -1), cache, cache[..., :512], lens, scale)
    torch.testing.assert_close(out.double(), ref, **TOL[torch.bfloat16])


def test_bad_block_table_raises():
    B, hq, hkv, D, ps = 2, 4, 4, 64, 16
    lens = torch.tensor([20, 20], dtype=torch.int32, device="cuda")
    kp = torch.randn(4, ps, hkv, D, device="cuda", dtype=torch.float16)
    bt = torch.tensor([[0, 1], [2, 99]], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=torch.float16)
    out = torch.full_like(q, 7.0)
    with pytest.raises(tessel.TesselArgumentError, match=r"block_table\[1, 1\]"):
        tessel.decode_attention(q, kp, kp, lens, out, block_table=bt, check_inputs=True)
    assert (out == 7.0).all()
    tessel.decode_attention(q, kp, kp, lens, out, block_table=bt)
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).all()
    with pytest.raises(tessel.TesselArgumentError, match="k_cache"):
        tessel.decode_attention(q, kp[..., :32], kp[..., :32], lens, out, block_table=bt)
