# Attention forward cases of bench/vs_torch.py (exec'd in its namespace: case, CaseSpec, dev,
# close, tessel, torch, F). Op attention_fwd, bf16, B=4, H=32, S=4096, D=128 and 64, causal
# and not, against torch SDPA's cuDNN and flash backends on the same tensors. SDPA gets its
# native (B, H, S, D) contiguous tensors; tessel reads the same memory as (B, S, H, D) views
# (any strides but the last). TFLOP/s counts 4*B*H*S*S*D flops, halved for causal. Records
# carry "causal" as a top-level boolean.


@case("attention_fwd", needs=("attention_forward",))
def _attention_cases(quick):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, s = (2, 16, 2048) if quick else (4, 32, 4096)
    specs = []
    for d in (128, 64):
        for causal in (False, True):
            q = dev(b, h, s, d, lo=-2.0, hi=2.0)
            k, v = dev(b, h, s, d), dev(b, h, s, d)
            o = torch.empty_like(q)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            ref = [None]

            def ours(q=q, k=k, v=v, o=o, lse=lse, causal=causal):
                tessel.attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         o.transpose(1, 2), lse, causal=causal)

            def sdpa(backend, q=q, k=k, v=v, causal=causal, ref=ref):  # bind this case's ref
                def run():
                    with sdpa_kernel(backend):
                        ref[0] = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return ref[0]

                return run

            cudnn, flash = sdpa(SDPBackend.CUDNN_ATTENTION), sdpa(SDPBackend.FLASH_ATTENTION)
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            specs.append(CaseSpec(
                "attention_fwd", f"B{b} H{h} S{s} D{d} {'causal' if causal else 'non-causal'}",
                {"B": b, "Hq": h, "Hkv": h, "Sq": s, "Skv": s, "D": d},
                "bf16", "TFLOP/s", flops, ours, cudnn,
                lambda o=o, ref=ref: close(o, ref[0], rtol=2e-2, atol=2e-2),
                baselines=[("cuDNN SDPA", cudnn, 1.0), ("flash SDPA", flash, 1.0)],
                flags={"causal": causal}))
    return specs
