# Decode-attention cases of bench/vs_torch.py (exec'd in its namespace: case, CaseSpec, dev,
# close, tessel, torch, F). Baselines: torch SDPA restricted to the cuDNN and the flash backend
# (torch.nn.attention.sdpa_kernel) on the same contiguous cache viewed as (B, H, S, D); GQA through
# enable_gqa when the backend takes it, else K/V expanded to Hq heads (materialized once, outside
# the timing). Metric: GB/s on the KV-cache bytes tessel reads (the same amount for every
# baseline, so ratios are time ratios). Target: >= 0.95x cuDNN, >= 1.0x flash.
import math as _math


def _sdpa_fn(backend, q, k, v, hq, hkv):
    """A callable timing SDPA on `backend`, GQA native if the backend accepts it."""
    from torch.nn.attention import sdpa_kernel

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def native():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=hkv != hq)

    try:
        native()
        torch.cuda.synchronize()
        return native
    except Exception:
        pass
    ke = kt.repeat_interleave(hq // hkv, 1)
    ve = vt.repeat_interleave(hq // hkv, 1)

    def expanded():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, ke, ve)

    return expanded


@case("decode_attention", needs=("decode_attention",))
def _decode_attention(quick):
    from torch.nn.attention import SDPBackend

    B, hq, hkv, S, D = (16, 32, 8, 4096, 128) if quick else (64, 32, 8, 8192, 128)
    q = dev(B, 1, hq, D, lo=-2, hi=2)
    k = dev(B, S, hkv, D)
    v = dev(B, S, hkv, D)
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    amount = float(2 * k.numel() * k.element_size())
    fns = {}
    for name, be in (("cuDNN SDPA", SDPBackend.CUDNN_ATTENTION), ("flash SDPA", SDPBackend.FLASH_ATTENTION)):
        try:
            fns[name] = _sdpa_fn(be, q, k, v, hq, hkv)
        except Exception as e:  # backend missing on this build: recorded as a failed baseline
            def failing(e=e):
                raise e
            fns[name] = failing
    baselines = [("cuDNN SDPA", fns["cuDNN SDPA"], 0.95), ("flash SDPA", fns["flash SDPA"], 1.0)]

    def check():
        ref = None
        for fn in (fns["cuDNN SDPA"], fns["flash SDPA"]):
            try:
                ref = fn().transpose(1, 2)
                break
            except Exception:
                continue
        if ref is None:
            return False, "no SDPA backend ran"
        return close(out, ref, rtol=2e-2, atol=2e-3)

    specs = []
    shape = {"B": B, "Hq": hq, "Hkv": hkv, "Sq": 1, "Skv": S, "D": D}
    specs.append(CaseSpec("decode_attention", f"B={B} Hq={hq} Hkv={hkv} Skv={S} D={D} contiguous",
                          shape, "bf16", "GB/s", amount,
                          lambda: tessel.decode_attention(q, k, v, lens, out), fns["cuDNN SDPA"],
                          check, baselines=baselines, flags={"paged": False}))
    for ps in (16, 64, 256):
        mp = S // ps
        perm = torch.randperm(B * mp, device="cuda")
        kp = torch.empty(B * mp, ps, hkv, D, device="cuda", dtype=k.dtype)
        vp = torch.empty_like(kp)
        kp[perm] = k.reshape(B * mp, ps, hkv, D)
        vp[perm] = v.reshape(B * mp, ps, hkv, D)
        bt = perm.reshape(B, mp).to(torch.int32)
        specs.append(CaseSpec(
            "decode_attention", f"B={B} Hq={hq} Hkv={hkv} Skv={S} D={D} paged {ps}",
            dict(shape, page_size=ps), "bf16", "GB/s", amount,
            lambda kp=kp, vp=vp, bt=bt: tessel.decode_attention(q, kp, vp, lens, out, block_table=bt),
            fns["cuDNN SDPA"], check, baselines=baselines, flags={"paged": True}))
    return specs
