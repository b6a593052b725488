// Stream-K work split (host and device; tests/test_stream_k_split.cpp): the `total` K steps of
// all output pieces (`ksn` steps each, piece-major) cut into `grid` contiguous runs of equal
// length (within one), one per persistent CTA (or cluster). A piece cut between CTAs is summed
// by whichever of them finishes last, from partials each CTA keeps in one of two slots —
// deterministic, since the finisher adds the pieces in CTA order whatever the arrival order.
// Used by the TMA GEMM (tiles x 64-deep K blocks) and the small-M ring kernel (16-row column
// slabs x 1024/2048-deep stages).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TESSEL_HD __host__ __device__
#else
#define TESSEL_HD
#endif

namespace tessel::tile {

struct StreamKSplit {
  int64_t total;  // pieces x ksn (the host keeps grid <= total: no empty run)
  int ksn;        // K steps per piece
  int grid;       // runs (CTAs or clusters)
  // First step of run c (start(grid) == total).
  TESSEL_HD int64_t start(int c) const { return int64_t{c} * total / grid; }
  // The run that holds step L: the largest c with start(c) <= L.
  TESSEL_HD int cta_of(int64_t L) const { return static_cast<int>(((L + 1) * grid - 1) / total); }
  // Where run c keeps its partial sums of `piece` when it holds only a part of it: 0 for the
  // piece its run starts in, 1 for the piece it ends in (a run holds at most those two parts;
  // every piece between them is whole).
  TESSEL_HD int slot(int c, int64_t piece) const { return piece == start(c) / ksn ? 0 : 1; }
  // The runs that hold parts of `piece`: first .. last (equal when one run holds it whole).
  TESSEL_HD int first_of(int64_t piece) const { return cta_of(piece * ksn); }
  TESSEL_HD int last_of(int64_t piece) const { return cta_of(piece * ksn + ksn - 1); }
};

}  // namespace tessel::tile
