"""tessel decode attention: a few new query tokens per sequence against a KV cache.

Every function takes (inputs..., outputs..., optional tensors, params..., stream=None), writes
its outputs in place and allocates nothing. See include/tessel/decode_attention.hpp for the
exact semantics:

* ``q (B, Sq, Hq, D)``, ``out`` like q, ``seqlens (B,)`` int32 on the device: lengths INCLUDING
  the Sq new tokens (new token s sits at position ``seqlens[b] - Sq + s``, causal).
* contiguous caches ``(B, Smax, Hkv, D)``; paged caches ``(num_pages, page_size, Hkv, D)`` with
  ``block_table (B, max_pages)`` int32. ``lse (B, Sq, Hq)`` float32, optional.
* ``check_inputs=True`` range-checks seqlens / block_table on the device (synchronizes) and
  raises TesselArgumentError; otherwise bad entries give NaN rows of that sequence only.
"""

from __future__ import annotations

from . import _tessel
from . import _plain, _stream_for

__all__ = ["append_kv", "append_latent", "decode_attention", "mla_decode"]


def _opt(t):
    return None if t is None else _plain(t)


def decode_attention(q, k_cache, v_cache, seqlens, out, lse=None, block_table=None, scale=0.0,
                     softcap=0.0, num_splits=0, check_inputs=False, stream=None,
                     max_seqlen=0) -> None:
    """``out = softmax(scale · q kᵀ [soft-capped], causal over the new tokens) v`` per query head;
    GQA when Hq is a multiple of Hkv. ``scale`` 0: 1/sqrt(D); ``num_splits`` 0: heuristic;
    ``max_seqlen`` (0: the cache capacity): the longest sequence, for the split plan only."""
    _tessel.decode_attention(_plain(q), _plain(k_cache), _plain(v_cache), _plain(seqlens),
                             _plain(out), _opt(lse), _opt(block_table), float(scale),
                             float(softcap), int(num_splits), int(max_seqlen),
                             bool(check_inputs), _stream_for((q,), stream))


def append_kv(k_new, v_new, k_cache, v_cache, seqlens, block_table=None, check_inputs=False,
              stream=None) -> None:
    """Write ``k_new/v_new (B, Sq, Hkv, D)`` into the caches at ``seqlens[b] - Sq + s``."""
    _tessel.append_kv(_plain(k_new), _plain(v_new), _plain(k_cache), _plain(v_cache),
                      _plain(seqlens), _opt(block_table), bool(check_inputs),
                      _stream_for((k_new,), stream))


def mla_decode(q_latent, q_rope, latent_cache, seqlens, out, lse=None, block_table=None,
               scale=0.0, num_splits=0, check_inputs=False, stream=None, max_seqlen=0) -> None:
    """MLA absorbed decode: ``q_latent (B, Sq, H, 512)``, ``q_rope (B, Sq, H, 64)``, latent cache
    ``(num_pages, page_size, 576)`` (or ``(B, Smax, 576)``) of rows ``[c | k_rope]``;
    ``out (B, Sq, H, 512) = softmax(scale · (q_latent·c + q_rope·k_rope)) · c``."""
    _tessel.mla_decode(_plain(q_latent), _plain(q_rope), _plain(latent_cache), _plain(seqlens),
                       _plain(out), _opt(lse), _opt(block_table), float(scale), int(num_splits),
                       int(max_seqlen), bool(check_inputs), _stream_for((q_latent,), stream))


def append_latent(c_new, latent_cache, seqlens, block_table=None, check_inputs=False,
                  stream=None) -> None:
    """Write ``c_new (B, Sq, 576)`` into the latent cache at ``seqlens[b] - Sq + s``."""
    _tessel.append_latent(_plain(c_new), _plain(latent_cache), _plain(seqlens),
                          _opt(block_table), bool(check_inputs), _stream_for((c_new,), stream))
