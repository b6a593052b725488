#include "runtime/autotune.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/check.hpp"
#include "runtime/l2_flush.hpp"
#include "tessel/tensor.hpp"

namespace tessel::autotune {

namespace fs = std::filesystem;

// ---- Cache ---------------------------------------------------------------------------------

Cache::Cache(std::string path) : path_(std::move(path)) {}

bool Cache::parse(const std::string& text, std::map<std::string, Entry>& out, std::string& why) {
  out.clear();
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    why = "not valid JSON";
    return false;
  }
  if (!j.is_object()) {
    why = "top level is not a JSON object";
    return false;
  }
  auto v = j.find("version");
  if (v == j.end() || !v->is_number_integer() || v->get<int64_t>() != 1) {
    why = "missing or unsupported \"version\" (expected 1)";
    return false;
  }
  auto e = j.find("entries");
  if (e == j.end() || !e->is_object()) {
    why = "missing \"entries\" object";
    return false;
  }
  for (auto it = e->begin(); it != e->end(); ++it) {
    const nlohmann::json& rec = it.value();
    if (!rec.is_object()) {
      why = "entry \"" + it.key() + "\" is not an object";
      return false;
    }
    auto c = rec.find("config");
    if (c == rec.end() || !c->is_number_integer()) {
      why = "entry \"" + it.key() + "\" has no integer \"config\"";
      return false;
    }
    const int64_t cfg = c->get<int64_t>();
    if (cfg < std::numeric_limits<int>::min() || cfg > std::numeric_limits<int>::max()) {
      why = "entry \"" + it.key() + "\" config out of range";
      return false;
    }
    Entry en;
    en.config = static_cast<int>(cfg);
    auto ms = rec.find("ms");
    if (ms != rec.end() && ms->is_number()) en.ms = ms->get<double>();
    out[it.key()] = en;
  }
  return true;
}

std::string Cache::serialize(const std::map<std::string, Entry>& entries) {
  nlohmann::ordered_json j;
  j["version"] = 1;
  nlohmann::ordered_json e = nlohmann::ordered_json::object();
  for (const auto& [k, v] : entries) e[k] = {{"config", v.config}, {"ms", v.ms}};
  j["entries"] = std::move(e);
  return j.dump(2) + "\n";
}

void Cache::warn_locked(const std::string& msg) {
  warning_ = msg;
  std::cerr << "tessel autotune: warning: " << msg << "\n";
}

namespace {

// Reads a whole file; false if it does not exist or cannot be read.
bool read_file(const std::string& path, std::string& text, bool& exists) {
  std::error_code ec;
  exists = fs::exists(path, ec);
  if (!exists) return false;
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  text = ss.str();
  return static_cast<bool>(f) || f.eof();
}

}  // namespace

void Cache::load_locked() {
  loaded_ = true;
  if (path_.empty()) return;
  std::string text;
  bool exists = false;
  if (!read_file(path_, text, exists)) {
    if (exists) warn_locked("cannot read cache file " + path_ + "; starting empty");
    return;
  }
  std::map<std::string, Entry> parsed;
  std::string why;
  if (!parse(text, parsed, why)) {
    warn_locked("ignoring malformed cache file " + path_ + " (" + why + "); it will be rewritten");
    return;
  }
  // Entries tuned in this process before the load win.
  for (auto& [k, v] : parsed) table_.emplace(k, v);
}

void Cache::ensure_loaded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
}

void Cache::save_locked() {
  if (path_.empty()) return;
  try {
    // Merge with the file as it is now (another process may have added keys).
    std::string text;
    bool exists = false;
    std::map<std::string, Entry> merged;
    std::string why;
    if (read_file(path_, text, exists) && parse(text, merged, why)) {
      for (auto& [k, v] : table_) merged[k] = v;
    } else {
      merged = table_;
    }
    const fs::path p(path_);
    std::error_code ec;
    if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
    const std::string tmp = path_ + ".tmp." + std::to_string(static_cast<long>(::getpid()));
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) {
        warn_locked("cannot write cache file " + tmp + "; results kept in memory only");
        return;
      }
      f << serialize(merged);
      f.flush();
      if (!f) {
        warn_locked("error writing cache file " + tmp + "; results kept in memory only");
        fs::remove(tmp, ec);
        return;
      }
    }
    fs::rename(tmp, p, ec);
    if (ec) {
      warn_locked("cannot rename " + tmp + " to " + path_ + ": " + ec.message());
      fs::remove(tmp, ec);
      return;
    }
    table_ = std::move(merged);
  } catch (const std::exception& e) {
    warn_locked(std::string("saving the cache failed: ") + e.what());
  }
}

std::optional<Entry> Cache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  auto it = table_.find(key);
  if (it == table_.end()) return std::nullopt;
  return it->second;
}

void Cache::put(const std::string& key, const Entry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  table_[key] = e;
  save_locked();
}

size_t Cache::size() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  return table_.size();
}

std::map<std::string, Entry> Cache::entries() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loaded_) load_locked();
  return table_;
}

std::string Cache::last_warning() {
  std::lock_guard<std::mutex> lock(mu_);
  return warning_;
}

// ---- environment ---------------------------------------------------------------------------

bool enabled() {
  const char* v = std::getenv("TESSEL_AUTOTUNE");
  return !(v != nullptr && std::string(v) == "0");
}

std::string default_cache_path() {
  if (const char* p = std::getenv("TESSEL_AUTOTUNE_CACHE"); p != nullptr && *p != '\0') return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return (fs::path(x) / "tessel" / "autotune.json").string();
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return (fs::path(h) / ".cache" / "tessel" / "autotune.json").string();
  return "";
}

Cache& global_cache() {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Cache>> caches;  // one per path, never freed
  const std::string path = default_cache_path();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Cache>& c = caches[path];
  if (!c) c = std::make_unique<Cache>(path);
  return *c;
}

int64_t bucket(int64_t v) {
  if (v <= 1) return 1;
  int64_t p = 1;
  while (p < v) {
    if (p >= 2 && p + p / 2 >= v) return p + p / 2;  // 3 * 2^(k-1)
    p *= 2;
  }
  return p;
}

std::string make_key(const std::string& family, const std::string& gpu, const std::string& dtype,
                     const std::string& layout, int64_t m, int64_t n, int64_t k) {
  return family + "|" + gpu + "|" + dtype + "|" + layout + "|m" + std::to_string(bucket(m)) + "|n" +
         std::to_string(bucket(n)) + "|k" + std::to_string(bucket(k));
}

std::string current_gpu_name() {
  static std::mutex mu;
  static std::map<int, std::string> names;  // per device, queried once
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return "unknown-gpu";
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = names.find(dev);
  if (it != names.end()) return it->second;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return "unknown-gpu";
  }
  return names[dev] = prop.name;
}

// ---- selection -----------------------------------------------------------------------------

namespace {
// TESSEL_AUTOTUNE_LOG=1: every candidate's time on stderr as it is measured.
bool log_candidates() {
  static const bool on = [] {
    const char* v = std::getenv("TESSEL_AUTOTUNE_LOG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}

std::mutex& tuning_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace

int select(Cache& cache, const std::string& key, const std::vector<int>& candidates, int fallback,
           const MeasureFn& measure, bool allow_tuning, const ConfirmFn& confirm) {
  auto usable = [&](const std::optional<Entry>& e) {
    return e && std::find(candidates.begin(), candidates.end(), e->config) != candidates.end();
  };
  if (auto e = cache.find(key); usable(e)) return e->config;
  if (!allow_tuning || candidates.empty() || !measure) return fallback;
  std::lock_guard<std::mutex> lock(tuning_mutex());
  if (auto e = cache.find(key); usable(e)) return e->config;  // another thread tuned it
  int best = fallback;
  double best_ms = std::numeric_limits<double>::infinity();
  double fallback_ms = -1.0;
  for (int c : candidates) {
    double ms = -1.0;
    try {
      ms = measure(c);
    } catch (const std::exception&) {
      ms = -1.0;
    }
    if (c == fallback) fallback_ms = ms;
    if (log_candidates())
      std::fprintf(stderr, "[tessel autotune] %s config %d: %.4f ms\n", key.c_str(), c, ms);
    if (ms >= 0.0 && ms < best_ms) {
      best_ms = ms;
      best = c;
    }
  }
  if (best_ms == std::numeric_limits<double>::infinity()) return fallback;  // nothing ran
  if (confirm && best != fallback && fallback_ms >= 0.0) {
    int kept = best;
    try {
      kept = confirm(best, fallback);
    } catch (const std::exception&) {
      kept = best;
    }
    if (kept == fallback) {
      best = fallback;
      best_ms = fallback_ms;
    }
  }
  cache.put(key, Entry{best, best_ms});
  return best;
}

int select_for_stream(cudaStream_t stream, const std::string& key,
                      const std::vector<int>& candidates, int fallback, const MeasureFn& measure,
                      const ConfirmFn& confirm) {
  if (!enabled()) return fallback;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  bool capturing = true;
  if (cudaStreamIsCapturing(stream, &st) == cudaSuccess)
    capturing = st != cudaStreamCaptureStatusNone;
  else
    cudaGetLastError();
  // Under capture (or if the status is unknown): never measure; a cached choice is fine.
  if (!capturing) {
    // A legacy-stream capture elsewhere in the process also forbids synchronizing work.
    cudaStreamCaptureStatus g = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(nullptr, &g) != cudaSuccess) {
      cudaGetLastError();
      capturing = true;
    } else if (g != cudaStreamCaptureStatusNone) {
      capturing = true;
    }
  }
  return select(global_cache(), key, candidates, fallback, measure, !capturing, confirm);
}

double time_on_stream(cudaStream_t stream, const std::function<void()>& fn, int warmup, int iters) {
  int dev = 0, l2 = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  TESSEL_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t flush_bytes = static_cast<size_t>(std::max(l2, 1 << 20)) * 2;
  // One flush buffer per device, kept for the process (tuning runs many measurements).
  static std::mutex mu;
  static std::map<int, DeviceBuffer> flush_buffers;
  void* flush = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    DeviceBuffer& fb = flush_buffers[dev];
    if (fb.bytes() < flush_bytes) {
      fb = DeviceBuffer(flush_bytes);
      TESSEL_CUDA_CHECK(cudaMemset(fb.data(), 0, flush_bytes));  // read by the flush below
    }
    flush = fb.data();
  }
  // A read flush (clean L2) by default: with a memset the write-back of ~L2-size dirty lines
  // lands inside the timed kernel and favours configs of memory-bound kernels that tolerate
  // it. TESSEL_AUTOTUNE_FLUSH=memset: the former flush (A/B).
  static const bool memset_flush = [] {
    const char* e = std::getenv("TESSEL_AUTOTUNE_FLUSH");
    return e && std::string(e) == "memset";
  }();
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  TESSEL_CUDA_CHECK(cudaEventCreate(&e0));
  struct Guard {
    cudaEvent_t& a;
    cudaEvent_t& b;
    ~Guard() {
      if (a) cudaEventDestroy(a);
      if (b) cudaEventDestroy(b);
    }
  } guard{e0, e1};
  TESSEL_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int i = 0; i < warmup + iters; ++i) {
    if (memset_flush)
      TESSEL_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xFF, flush_bytes, stream));
    else
      detail::l2_flush_read(flush, flush_bytes, stream);
    TESSEL_CUDA_CHECK(cudaEventRecord(e0, stream));
    fn();
    TESSEL_CUDA_CHECK(cudaEventRecord(e1, stream));
    TESSEL_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    TESSEL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= warmup) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times.empty() ? 0.0 : times[times.size() / 2];
}

// ---- ahead-of-time tuning -------------------------------------------------------------------

namespace {
std::mutex& pretune_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, PretuneFn>& pretune_table() {
  static std::map<std::string, PretuneFn> t;
  return t;
}
}  // namespace

void register_pretune(const std::string& family, PretuneFn fn) {
  std::lock_guard<std::mutex> lock(pretune_mutex());
  pretune_table()[family] = std::move(fn);
}

std::vector<std::string> pretune_families() {
  std::lock_guard<std::mutex> lock(pretune_mutex());
  std::vector<std::string> names;
  for (const auto& [k, v] : pretune_table()) names.push_back(k);
  return names;
}

std::vector<std::string> pretune(const std::string& family,
                                 const std::vector<std::vector<int64_t>>& shapes) {
  PretuneFn fn;
  {
    std::lock_guard<std::mutex> lock(pretune_mutex());
    auto it = pretune_table().find(family);
    if (it == pretune_table().end())
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                  "tessel autotune: unknown family '" + family + "'");
    fn = it->second;
  }
  std::vector<std::string> report;
  fn(shapes, report);
  return report;
}

std::vector<std::vector<int64_t>> parse_shapes(const std::string& text) {
  std::vector<std::vector<int64_t>> shapes;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    std::vector<int64_t> dims;
    std::stringstream is(item);
    std::string d;
    while (std::getline(is, d, 'x')) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (d.empty() || end == nullptr || *end != '\0' || v <= 0)
        throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                    "tessel autotune: bad shape '" + item + "' (expected MxNxK, positive)");
      dims.push_back(v);
    }
    if (dims.size() != 3)
      throw Error(TESSEL_ERROR_INVALID_ARGUMENT,
                  "tessel autotune: bad shape '" + item + "' (expected MxNxK)");
    shapes.push_back(std::move(dims));
  }
  return shapes;
}

}  // namespace tessel::autotune
