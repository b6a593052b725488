#include "llm/generate.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>

#include "tessel/tensor.hpp"

namespace tessel::llm {

std::vector<Generation> generate(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& options, const Detokenize& detokenize,
                                 const StreamCallback& on_piece, GenerateStats* stats) {
  using clock = std::chrono::steady_clock;
  const int64_t n = static_cast<int64_t>(prompts.size());
  const int64_t V = model.config().vocab_size;
  std::vector<Generation> out(static_cast<size_t>(n));
  if (n == 0) return out;
  int64_t longest = 0;
  for (const auto& p : prompts) {
    if (p.empty())
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                  "tessel::generate: 'prompt' expected at least one token, got 0");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  }
  const int64_t ctx = model.config().max_positions;
  if (longest >= ctx)
    throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                "tessel::generate: 'prompt' expected fewer than " + std::to_string(ctx) +
                    " tokens (the context), got " + std::to_string(longest));
  const int64_t max_seq = std::min<int64_t>(ctx, longest + std::max(options.max_tokens, 0));
  if (model.slots() < n || model.max_seq() < max_seq) model.reserve(n, max_seq);

  std::vector<std::vector<int32_t>> history(prompts.begin(), prompts.end());
  std::vector<std::unique_ptr<Sampler>> samplers;
  std::vector<StopStrings> stops;
  for (int64_t i = 0; i < n; ++i) {
    SamplerConfig sc = options.sampling;
    sc.seed += static_cast<uint64_t>(i);
    samplers.push_back(std::make_unique<Sampler>(sc));
    stops.emplace_back(options.stop_strings);
  }
  std::vector<bool> done(static_cast<size_t>(n), options.max_tokens <= 0);
  for (int64_t i = 0; i < n && options.max_tokens <= 0; ++i) out[i].finish_reason = "length";

  // Greedy everywhere and nobody looks at the logits: the backend picks the tokens where the
  // logits are (the GPU downloads one id per sequence instead of a vocabulary row).
  bool device_greedy = !options.on_logits;
  for (const auto& s : samplers) device_greedy = device_greedy && s->plain_greedy();
  std::vector<int32_t> picked;  // device_greedy: the step's tokens
  std::vector<float> logits;    // otherwise: the step's logits rows
  std::vector<int32_t> tokens, slots, positions;
  std::vector<int64_t> logit_rows;
  auto forward = [&] {
    if (device_greedy)
      picked = model.forward_greedy(tokens, slots, positions, logit_rows);
    else
      logits = model.forward(tokens, slots, positions, logit_rows);
  };

  // Handles sequence i's token (picked already when tok >= 0, else sampled from logits);
  // returns false once the sequence has finished.
  auto accept = [&](int64_t i, int32_t tok, std::span<float> logits) {
    if (tok < 0) {
      if (options.on_logits) options.on_logits(static_cast<size_t>(i), logits);
      tok = samplers[i]->sample(logits, history[i]);
    }
    Generation& g = out[i];
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), tok) !=
        options.stop_tokens.end()) {
      g.finish_reason = "stop_token";
    } else {
      g.tokens.push_back(tok);
      history[i].push_back(tok);
      const std::string piece = stops[i].feed(detokenize ? detokenize(tok) : std::string());
      g.text += piece;
      if (on_piece && !piece.empty()) on_piece(static_cast<size_t>(i), piece);
      if (stops[i].stopped())
        g.finish_reason = "stop_string";
      else if (static_cast<int32_t>(g.tokens.size()) >= options.max_tokens)
        g.finish_reason = "length";
      else if (static_cast<int64_t>(history[i].size()) >= model.max_seq())
        g.finish_reason = "context";
    }
    if (g.finish_reason.empty()) return true;
    const std::string rest = stops[i].flush();
    g.text += rest;
    if (on_piece && !rest.empty()) on_piece(static_cast<size_t>(i), rest);
    return false;
  };

  // Row a of the last step belongs to sequence i.
  auto accept_row = [&](size_t a, int64_t i) {
    if (device_greedy) return accept(i, picked[a], std::span<float>());
    return accept(i, -1, std::span<float>(logits.data() + a * V, static_cast<size_t>(V)));
  };

  GenerateStats st;
  if (options.max_tokens > 0) {
    // Prefill: every prompt in one forward, logits of each prompt's last row.
    for (int64_t i = 0; i < n; ++i) {
      size_t start = 0;
      if (options.reuse_prefix) {
        // Keep at least the last prompt token to produce its logits.
        const std::vector<int32_t>& cached = model.cached_tokens(i);
        while (start + 1 < prompts[i].size() && start < cached.size() &&
               cached[start] == prompts[i][start])
          ++start;
      }
      for (size_t t = start; t < prompts[i].size(); ++t) {
        tokens.push_back(prompts[i][t]);
        slots.push_back(static_cast<int32_t>(i));
        positions.push_back(static_cast<int32_t>(t));
      }
      logit_rows.push_back(static_cast<int64_t>(tokens.size()) - 1);
    }
    const auto t0 = clock::now();
    forward();
    st.prefill_tokens = static_cast<int64_t>(tokens.size());
    for (int64_t i = 0; i < n; ++i) done[i] = !accept_row(static_cast<size_t>(i), i);
    st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  }
  const auto t1 = clock::now();
  const double wait0 = model.backend().device_wait_seconds();
  // Greedy decode with the next step in flight: while the host reads step t's tokens, step
  // t + 1 already runs with those tokens fed on the device (Model::greedy_start). It is
  // enqueued only when every active sequence can take two more tokens; when a sequence then
  // finishes at step t, step t + 1's results are dropped (its cache rows hold the tokens
  // the host saw, so cached_tokens stays true) and the remaining rows rerun it.
  bool pipelined = device_greedy && model.backend().can_pipeline_greedy();
  struct Drain {  // an exception leaves no step started (forward() refuses to run otherwise)
    Model& m;
    ~Drain() {
      while (m.greedy_started() > 0) {
        try {
          m.greedy_finish();
        } catch (...) {
          break;
        }
      }
    }
  } drain{model};
  // The next decode step's rows: each unfinished sequence's last token at its position.
  std::vector<int64_t> active;
  auto gather_active = [&] {
    active.clear();
    tokens.clear();
    slots.clear();
    positions.clear();
    logit_rows.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      logit_rows.push_back(static_cast<int64_t>(tokens.size()));
      tokens.push_back(history[i].back());
      slots.push_back(static_cast<int32_t>(i));
      positions.push_back(static_cast<int32_t>(history[i].size()) - 1);
      active.push_back(i);
    }
  };
  while (pipelined) {
    gather_active();
    if (active.empty()) break;
    auto f0 = clock::now();
    pipelined = model.greedy_start(tokens, slots, positions, logit_rows, false);
    st.decode_forward_seconds += std::chrono::duration<double>(clock::now() - f0).count();
    if (!pipelined) break;
    for (bool same_rows = true; same_rows;) {
      // Step t is in flight; its rows continue at the next position.
      bool ahead = true;
      for (size_t a = 0; a < active.size() && ahead; ++a) {
        const int64_t i = active[a];
        ahead = static_cast<int64_t>(out[i].tokens.size()) + 2 <= options.max_tokens &&
                static_cast<int64_t>(history[i].size()) + 2 <= model.max_seq();
        positions[a] = static_cast<int32_t>(history[i].size());
      }
      f0 = clock::now();
      if (ahead) model.greedy_start(tokens, slots, positions, logit_rows, true);
      picked = model.greedy_finish();
      st.decode_forward_seconds += std::chrono::duration<double>(clock::now() - f0).count();
      for (size_t a = 0; a < active.size(); ++a) {
        const int64_t i = active[a];
        done[i] = !accept_row(a, i);
        same_rows = same_rows && !done[i];
        ++st.decode_tokens;
      }
      if (!ahead) {
        same_rows = false;  // every row's next step starts afresh (or the run is over)
      } else if (!same_rows) {
        f0 = clock::now();
        model.greedy_finish();  // step t + 1 ran for a finished row: drop it, rerun the rest
        st.decode_forward_seconds += std::chrono::duration<double>(clock::now() - f0).count();
      }
    }
  }
  for (;;) {
    gather_active();
    if (active.empty()) break;
    const auto f0 = clock::now();
    forward();
    st.decode_forward_seconds += std::chrono::duration<double>(clock::now() - f0).count();
    for (size_t a = 0; a < active.size(); ++a) {
      const int64_t i = active[a];
      done[i] = !accept_row(a, i);
      ++st.decode_tokens;
    }
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  st.decode_device_wait_seconds = model.backend().device_wait_seconds() - wait0;
  if (stats) *stats = st;
  return out;
}

}  // namespace tessel::llm
