#include "llm_commands.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llm/generate.hpp"
#include "llm/logits_dump.hpp"
#include "llm/model.hpp"
#include "llm/tokenizer.hpp"

namespace tessel::cli {

namespace {

struct LlmOptions {
  std::string model;
  std::vector<std::string> prompts;
  std::vector<std::string> prompt_ids;  // "1,2,3" per sequence: bypasses the tokenizer
  std::string dump_logits;              // .npy of every step's logits (see llm/logits_dump.hpp)
  bool ignore_eos = false;
  int warmup = 0;  // untimed runs of the same prompts before the reported one
  std::string system;
  int max_tokens = 256;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  std::string backend = "auto";
  int threads = 0;
  int context = 2048;
  bool chat = false;
  std::vector<std::string> stop;
};

void add_common_options(CLI::App* cmd, LlmOptions& o) {
  cmd->add_option("--model,-m", o.model, "a .gguf file or a Hugging Face folder")->required();
  cmd->add_option("--max-tokens,-n", o.max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", o.top_p, "1 = off")->capture_default_str();
  cmd->add_option("--min-p", o.min_p, "0 = off")->capture_default_str();
  cmd->add_option("--repeat-penalty", o.repeat_penalty, "1 = off")->capture_default_str();
  cmd->add_option("--presence-penalty", o.presence_penalty)->capture_default_str();
  cmd->add_option("--frequency-penalty", o.frequency_penalty)->capture_default_str();
  cmd->add_option("--seed", o.seed, "sampling seed (same seed, same text)")->capture_default_str();
  cmd->add_option("--backend", o.backend, "auto (gpu on a Hopper GPU, else cpu), cpu or gpu")
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "CPU backend threads (0 = all cores)");
  cmd->add_option("--context", o.context, "KV cache length cap")->capture_default_str();
  cmd->add_option("--stop", o.stop, "stop string (repeatable)");
  cmd->add_option("--system", o.system, "system message (chat template)");
}

// Stop token ids: the tokenizer's EOS ids (GGUF) or generation_config/config.json (HF folder).
std::vector<int32_t> stop_tokens(const llm::LoadedModel& lm, const std::string& path) {
  if (lm.gguf_tokenizer) {
    std::vector<int32_t> ids = lm.gguf_tokenizer->eos_ids;
    if (ids.empty() && lm.gguf_tokenizer->eos_id >= 0) ids.push_back(lm.gguf_tokenizer->eos_id);
    return ids;
  }
  std::vector<int32_t> ids;
  for (const char* file : {"generation_config.json", "config.json"}) {
    std::ifstream in(std::filesystem::path(path) / file);
    if (!in) continue;
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("eos_token_id")) continue;
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) ids.push_back(e.get<int32_t>());
    if (e.is_array())
      for (const auto& x : e)
        if (x.is_number_integer()) ids.push_back(x.get<int32_t>());
    if (!ids.empty()) break;
  }
  return ids;
}

struct Session {
  llm::LoadedModel lm;
  std::unique_ptr<llm::Tokenizer> tok;  // null for an HF folder without tokenizer.json
  std::vector<int32_t> stops;
};

Session open_session(const LlmOptions& o) {
  Session s;
  s.lm = llm::load_model(o.model, llm::make_backend(o.backend, o.threads));
  if (s.lm.gguf_tokenizer)
    s.tok = std::make_unique<llm::Tokenizer>(llm::Tokenizer::from_data(*s.lm.gguf_tokenizer));
  else if (std::filesystem::exists(s.lm.tokenizer_json))
    s.tok = std::make_unique<llm::Tokenizer>(llm::Tokenizer::from_hf_json(s.lm.tokenizer_json));
  else if (o.prompt_ids.empty())
    throw std::runtime_error("'tokenizer' expected " + s.lm.tokenizer_json +
                             " (or --prompt-ids), got no such file");
  if (!o.ignore_eos) s.stops = stop_tokens(s.lm, o.model);
  std::cerr << "[tessel] " << s.lm.model->config().summary() << "\n[tessel] " << s.lm.format
            << " loaded in " << s.lm.load_seconds << " s on " << s.lm.model->backend().name()
            << "\n";
  return s;
}

llm::GenerateOptions gen_options(const LlmOptions& o, const Session& s) {
  llm::GenerateOptions g;
  g.max_tokens = o.max_tokens;
  g.sampling.temperature = o.temperature;
  g.sampling.top_k = o.top_k;
  g.sampling.top_p = o.top_p;
  g.sampling.min_p = o.min_p;
  g.sampling.repetition_penalty = o.repeat_penalty;
  g.sampling.presence_penalty = o.presence_penalty;
  g.sampling.frequency_penalty = o.frequency_penalty;
  g.sampling.seed = o.seed;
  g.stop_tokens = s.stops;
  g.stop_strings = o.stop;
  return g;
}

std::vector<int32_t> encode_turns(const Session& s, const LlmOptions& o,
                                  const std::vector<llm::ChatMessage>& turns, bool chat) {
  if (!chat) return s.tok->encode(turns.back().content, true);
  std::vector<llm::ChatMessage> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  msgs.insert(msgs.end(), turns.begin(), turns.end());
  // The template writes any BOS itself.
  return s.tok->encode(s.tok->apply_chat_template(msgs, true), false);
}

void print_summary(const Session& s, const llm::GenerateStats& st, size_t sequences) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::fprintf(stderr,
               "\n[tessel] %zu sequence(s): prefill %lld tok in %.4f s (%.1f tok/s), decode %lld "
               "tok in %.4f s (%.2f tok/s); backend memory %.1f MiB, peak RSS %.1f MiB; decode "
               "steps in forward() %.4f s (waiting for the device %.4f s)\n",
               sequences, static_cast<long long>(st.prefill_tokens), st.prefill_seconds,
               st.prefill_tok_per_s(), static_cast<long long>(st.decode_tokens), st.decode_seconds,
               st.decode_tok_per_s(), s.lm.model->backend().bytes_in_use() / 1048576.0,
               ru.ru_maxrss / 1024.0, st.decode_forward_seconds, st.decode_device_wait_seconds);
}

int run_command(const LlmOptions& o) {
  if (o.prompts.empty() == o.prompt_ids.empty())
    throw std::runtime_error("'prompt' expected --prompt or --prompt-ids, got " +
                             std::string(o.prompts.empty() ? "neither" : "both"));
  if (!o.prompt_ids.empty() && o.chat)
    throw std::runtime_error("'chat' expected text prompts, got --prompt-ids");
  Session s = open_session(o);
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : o.prompts)
    prompts.push_back(encode_turns(s, o, {{"user", p}}, o.chat));
  for (const std::string& p : o.prompt_ids)
    prompts.push_back(llm::parse_token_ids(p, s.lm.model->config().vocab_size));
  const int64_t ctx = std::min<int64_t>(o.context, s.lm.model->config().max_positions);
  llm::GenerateOptions g = gen_options(o, s);
  llm::LogitsRecorder recorder(prompts.size(), s.lm.model->config().vocab_size);
  if (!o.dump_logits.empty())
    g.on_logits = [&recorder](size_t i, std::span<const float> l) { recorder.record(i, l); };
  llm::GenerateStats st;
  const bool ids_out = !o.prompt_ids.empty();
  const bool stream = prompts.size() == 1 && !ids_out;
  auto detok = [&](int32_t id) { return s.tok ? s.tok->decode_token(id) : std::string(); };
  for (auto& p : prompts)
    if (static_cast<int64_t>(p.size()) + g.max_tokens > ctx)
      g.max_tokens =
          static_cast<int32_t>(std::max<int64_t>(1, ctx - static_cast<int64_t>(p.size())));
  // Warm-up runs (benchmarks; llama-bench and the e2e baseline warm up too): the first call of
  // each kernel configures it (shared-memory opt-in, TMA descriptors, scratch, the memory pool),
  // which would otherwise land in the reported prefill. Untimed, nothing printed.
  for (int i = 0; i < o.warmup; ++i) {
    llm::GenerateOptions w = g;
    w.max_tokens = std::min<int32_t>(g.max_tokens, 4);
    w.on_logits = nullptr;
    llm::generate(*s.lm.model, prompts, w, detok);
  }
  if (o.warmup > 0)
    std::fprintf(stderr, "[tessel] %d untimed warm-up run(s) of the same prompts done\n", o.warmup);
  if (stream && !o.chat) std::cout << o.prompts[0];
  const auto results =
      llm::generate(*s.lm.model, prompts, g, detok,
                    stream ? llm::StreamCallback([](size_t, const std::string& piece) {
                      std::cout << piece << std::flush;
                    })
                           : llm::StreamCallback(),
                    &st);
  if (ids_out) {
    // One line of generated ids per sequence: what a checking script parses.
    for (const auto& r : results) {
      for (size_t t = 0; t < r.tokens.size(); ++t) std::cout << (t ? " " : "") << r.tokens[t];
      std::cout << "\n";
    }
  } else if (stream) {
    std::cout << "\n";
  } else {
    for (size_t i = 0; i < results.size(); ++i)
      std::cout << "=== [" << i << "] " << o.prompts[i] << (o.chat ? "\n" : "") << results[i].text
                << "\n";
  }
  for (size_t i = 0; i < results.size(); ++i)
    std::cerr << "[tessel] sequence " << i << ": " << results[i].tokens.size()
              << " tokens, finish: " << results[i].finish_reason << "\n";
  if (!o.dump_logits.empty()) {
    recorder.write_npy(o.dump_logits);
    std::cerr << "[tessel] logits written to " << o.dump_logits << "\n";
  }
  print_summary(s, st, results.size());
  return 0;
}

int chat_command(const LlmOptions& o) {
  Session s = open_session(o);
  std::vector<llm::ChatMessage> turns;
  std::cerr << "[tessel] chat: type a message; /reset clears the history, /exit (or EOF) quits\n";
  std::string line;
  auto detok = [&](int32_t id) { return s.tok->decode_token(id); };
  const int64_t ctx = std::min<int64_t>(o.context, s.lm.model->config().max_positions);
  // One cache for the whole conversation: each turn prefills only what the cache lacks.
  s.lm.model->reserve(1, ctx);
  for (;;) {
    std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") {
      std::cout << "\n";
      break;
    }
    if (line == "/reset") {
      turns.clear();
      continue;
    }
    if (line.empty()) continue;
    turns.push_back({"user", line});
    const std::vector<int32_t> prompt = encode_turns(s, o, turns, true);
    llm::GenerateOptions g = gen_options(o, s);
    g.reuse_prefix = true;
    if (static_cast<int64_t>(prompt.size()) >= ctx) {
      std::cerr << "[tessel] conversation exceeds the context; /reset\n";
      turns.pop_back();
      continue;
    }
    g.max_tokens = static_cast<int32_t>(std::min<int64_t>(g.max_tokens, ctx - prompt.size()));
    llm::GenerateStats st;
    const auto res = llm::generate(
        *s.lm.model, {prompt}, g, detok,
        [](size_t, const std::string& piece) { std::cout << piece << std::flush; }, &st);
    std::cout << "\n";
    turns.push_back({"assistant", res[0].text});
    print_summary(s, st, 1);
  }
  return 0;
}

}  // namespace

void add_llm_commands(CLI::App& app, int& rc) {
  auto run_opts = std::make_shared<LlmOptions>();
  CLI::App* run = app.add_subcommand("run", "generate text with a Llama-family model");
  add_common_options(run, *run_opts);
  run->add_option("--prompt,-p", run_opts->prompts, "prompt (repeat for a batch)");
  run->add_option("--prompt-ids", run_opts->prompt_ids,
                  "token ids \"1,2,3\" instead of text (repeat for a batch); prints the "
                  "generated ids, one line per sequence");
  run->add_option("--dump-logits", run_opts->dump_logits,
                  "write every step's float32 logits as .npy, shape (sequences, steps, vocab); "
                  "NaN after a sequence ends");
  run->add_flag("--ignore-eos", run_opts->ignore_eos, "do not stop at the model's EOS tokens");
  run->add_option("--warmup", run_opts->warmup,
                  "untimed runs of the same prompts (up to 4 new tokens) before the reported one")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  run->add_flag("--chat", run_opts->chat, "wrap the prompt in the model's chat template");
  run->callback([&rc, run_opts] {
    try {
      rc = run_command(*run_opts);
    } catch (const std::exception& e) {
      std::cerr << "tessel run: " << e.what() << "\n";
      rc = 2;
    }
  });
  auto chat_opts = std::make_shared<LlmOptions>();
  chat_opts->chat = true;
  CLI::App* chat = app.add_subcommand("chat", "interactive chat with a model's chat template");
  add_common_options(chat, *chat_opts);
  chat->callback([&rc, chat_opts] {
    try {
      rc = chat_command(*chat_opts);
    } catch (const std::exception& e) {
      std::cerr << "tessel chat: " << e.what() << "\n";
      rc = 2;
    }
  });
}

}  // namespace tessel::cli
