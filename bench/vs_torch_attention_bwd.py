# Attention backward cases of bench/vs_torch.py (exec'd in its namespace: case, CaseSpec, dev,
# tessel, torch, F). Op attention_bwd, bf16, B=4, H=32, S=4096, D=128 and 64 (256 with H=16), causal
# and not, against torch SDPA's backward with the flash and cuDNN backends on the same tensors
# (cuDNN where it takes the head dim). Timed: the backward alone (torch: autograd.grad of a retained
# SDPA graph, which runs the backend's backward kernels, preprocess included; tessel:
# attention_backward given the forward's out and lse). SDPA gets its native (B, H, S, D) tensors;
# tessel reads the same memory as (B, S, H, D) views. TFLOP/s counts 2.5 x the forward's 4*B*H*S*S*D
# flops, halved for causal. Check: tessel's dq/dk/dv against flash SDPA's, relative L2 error <= 2e-2
# each.


@case("attention_bwd", needs=("attention_backward", "attention_forward"))
def _attention_bwd_cases(quick):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h0, s = (2, 16, 2048) if quick else (4, 32, 4096)
    specs = []
    # Head dim 256 with half the heads (the same flops as D128).
    for d, h in ((128, h0), (64, h0), (256, h0 // 2)):
        for causal in (False, True):
            q = dev(b, h, s, d, lo=-2.0, hi=2.0)
            k, v, g = dev(b, h, s, d), dev(b, h, s, d), dev(b, h, s, d)
            o = torch.empty_like(q)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            tessel.attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     o.transpose(1, 2), lse, causal=causal)
            grads = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]

            def ours(q=q, k=k, v=v, o=o, g=g, lse=lse, grads=grads, causal=causal):
                tessel.attention_backward(*(t.transpose(1, 2) for t in (q, k, v, o, g)), lse,
                                          *(t.transpose(1, 2) for t in grads), causal=causal)

            def sdpa_bwd(backend, q=q, k=k, v=v, g=g, causal=causal):
                qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                res = [None]

                def run():
                    res[0] = torch.autograd.grad(out, (qr, kr, vr), g, retain_graph=True)
                    return res[0]

                return run, res

            flash, flash_res = sdpa_bwd(SDPBackend.FLASH_ATTENTION)
            baselines = [("flash SDPA bwd", flash, 1.8)]
            try:  # cuDNN's backward may not take every head dim: then flash alone
                cudnn, _ = sdpa_bwd(SDPBackend.CUDNN_ATTENTION)
                cudnn()
                baselines.append(("cuDNN SDPA bwd", cudnn, 1.0))
            except RuntimeError:
                pass

            def check(grads=grads, flash_res=flash_res):
                ok, parts = True, []
                for name, a, r in zip(("dq", "dk", "dv"), grads, flash_res[0]):
                    a, r = a.float(), r.float()
                    rel = ((a - r).norm() / r.norm().clamp_min(1e-30)).item()
                    ok = ok and rel <= 2e-2
                    parts.append(f"{name} rel_l2={rel:.3g}")
                return ok, ", ".join(parts)

            flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            specs.append(CaseSpec(
                "attention_bwd", f"B{b} H{h} S{s} D{d} {'causal' if causal else 'non-causal'}",
                {"B": b, "Hq": h, "Hkv": h, "Sq": s, "Skv": s, "D": d},
                "bf16", "TFLOP/s", flops, ours, flash, check,
                baselines=baselines,
                flags={"causal": causal}))
    return specs
