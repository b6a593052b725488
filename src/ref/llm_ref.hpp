// float64 CPU references of the LLM operator set (activation.hpp, dropout.hpp, rope.hpp,
// embedding.hpp). Plain C++, dense row-major host arrays, conventions of reference.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace tessel::ref {

// ---- activations --------------------------------------------------------------------------
enum class Act : int32_t { silu, gelu_erf, gelu_tanh };
double act(Act a, double x);       // silu x·σ(x); gelu_erf; gelu_tanh
double act_grad(Act a, double x);  // d act / dx

// out = act(gate) * up, elementwise (gate/up/out same length).
std::vector<double> glu(Act a, std::span<const double> gate, std::span<const double> up);
// dgate = dout·up·act'(gate), dup = dout·act(gate).
void glu_backward(Act a, std::span<const double> gate, std::span<const double> up,
                  std::span<const double> dout, std::vector<double>& dgate,
                  std::vector<double>& dup);
std::vector<double> act_forward(Act a, std::span<const double> x);
std::vector<double> act_backward(Act a, std::span<const double> x, std::span<const double> dy);
// Fused (rows, 2H) <-> halves.
void split_halves(std::span<const double> x, int64_t rows, int64_t h, std::vector<double>& gate,
                  std::vector<double>& up);
std::vector<double> join_halves(std::span<const double> a, std::span<const double> b,
                                int64_t rows, int64_t h);

// ---- Philox 4x32-10 and dropout -----------------------------------------------------------
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);
uint32_t dropout_threshold(double p);  // round(p · 2^16)
// keep bit of element i (see include/tessel/dropout.hpp).
bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, double p);
std::vector<uint8_t> dropout_mask(size_t n, double p, uint64_t seed, uint64_t offset);
// y = x · keep / (1 - p) (0 when p == 1).
std::vector<double> dropout(std::span<const double> x, double p, uint64_t seed, uint64_t offset);

// ---- RoPE -----------------------------------------------------------------------------------
struct RopeConfig {
  bool neox = true;
  int64_t rotary_dim = 0;  // 0: head_dim
  double theta = 10000.0;
  bool llama3 = false;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};
// rotary_dim/2 inverse frequencies (Llama-3 scaled when cfg.llama3).
std::vector<double> rope_inv_freq(const RopeConfig& cfg, int64_t rotary_dim);
// x (tokens, heads, head_dim) dense, rotated in place by +angle (or −angle if inverse).
void rope(std::vector<double>& x, int64_t tokens, int64_t heads, int64_t head_dim,
          std::span<const int64_t> positions, const RopeConfig& cfg, bool inverse);

// ---- embedding ------------------------------------------------------------------------------
// out (n, D) = weight[ids[i]] (zero rows for out-of-range ids).
std::vector<double> embedding(std::span<const int64_t> ids, std::span<const double> weight,
                              int64_t vocab, int64_t dim);
// dweight (V, D) = scatter-add of dout rows (out-of-range ids ignored), exact sums.
std::vector<double> embedding_backward(std::span<const int64_t> ids, std::span<const double> dout,
                                       int64_t vocab, int64_t dim);

}  // namespace tessel::ref
