// Autotuner: pick one of a kernel family's candidate configurations per problem key by
// measuring them on first use, and remember the winner on disk.
//
//   key       family | GPU name | dtype | layout | bucketed M, N, K   (make_key)
//   candidates a list of config ids the family knows how to launch; `fallback` is the
//             deterministic default (used when tuning is off, inside CUDA graph capture,
//             or when every candidate fails to measure)
//   cache     JSON, default ~/.cache/tessel/autotune.json ($XDG_CACHE_HOME/tessel/… when
//             set), overridden by TESSEL_AUTOTUNE_CACHE=<path>; TESSEL_AUTOTUNE=0 turns
//             tuning and the cache off (always `fallback`).
//
// File format (version 1):
//   {"version": 1, "entries": {"<key>": {"config": 3, "ms": 0.0123}, ...}}
// A missing file is an empty cache. A malformed file (bad JSON, wrong version, wrong field
// types) is ignored with one warning on stderr and overwritten by the next save; it never
// throws. Saves merge with what is on disk (other processes may have tuned other keys) and
// are atomic (write to a temporary file, rename).
//
// Thread-safe: one mutex guards the in-memory table and the file; measurement of one key
// runs under a separate tuning mutex so two threads never tune at once (the second waits and
// then finds the first's result). Measure callbacks must not call select() themselves.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tessel::autotune {

struct Entry {
  int config = 0;
  double ms = 0.0;  // measured time of the winner (informational)
};

// A file-backed table key -> Entry. path "" keeps it in memory only.
class Cache {
 public:
  explicit Cache(std::string path);

  const std::string& path() const { return path_; }
  // Loads the file once (lazily on the first find/put); later calls are no-ops.
  void ensure_loaded();
  std::optional<Entry> find(const std::string& key);
  // Stores the entry and saves the file (merging with entries on disk). Never throws:
  // write errors are reported once on stderr.
  void put(const std::string& key, const Entry& e);
  size_t size();
  std::map<std::string, Entry> entries();
  // Last load/save problem (empty if none): for tests and `tessel tune`.
  std::string last_warning();

  // Parses `text` into entries; returns false and sets `why` on a malformed document.
  static bool parse(const std::string& text, std::map<std::string, Entry>& out, std::string& why);
  static std::string serialize(const std::map<std::string, Entry>& entries);

 private:
  void load_locked();
  void save_locked();
  void warn_locked(const std::string& msg);

  std::string path_;
  std::mutex mu_;
  bool loaded_ = false;
  std::map<std::string, Entry> table_;
  std::string warning_;
};

// TESSEL_AUTOTUNE is not "0" (read on every call; cheap).
bool enabled();
// TESSEL_AUTOTUNE_CACHE, else $XDG_CACHE_HOME/tessel/autotune.json, else
// $HOME/.cache/tessel/autotune.json, else "" (memory only).
std::string default_cache_path();
// The process-wide cache at default_cache_path() as of the first call; if the environment
// variable changes later, a new Cache for the new path replaces it.
Cache& global_cache();

// Round up to the bucket grid {2^k, 3·2^(k-1)}: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, ...
int64_t bucket(int64_t v);
std::string make_key(const std::string& family, const std::string& gpu, const std::string& dtype,
                     const std::string& layout, int64_t m, int64_t n, int64_t k);
// Name of the current CUDA device ("NVIDIA H100 80GB HBM3"), "unknown-gpu" on error.
std::string current_gpu_name();

// Measures one candidate: milliseconds, or a negative value / exception if it cannot run.
using MeasureFn = std::function<double(int config)>;

// A second look when the fastest candidate of one pass is not the fallback: returns the config
// to keep (a family may time the two alternately, so that one noisy pass cannot replace a good
// default). An exception keeps `best`.
using ConfirmFn = std::function<int(int best, int fallback)>;

// Core choice (no CUDA): cached entry whose config is among `candidates` -> it; else if
// `allow_tuning`, measure every candidate, confirm a winner other than the fallback (when
// `confirm` is given), store and return it; else `fallback`.
int select(Cache& cache, const std::string& key, const std::vector<int>& candidates, int fallback,
           const MeasureFn& measure, bool allow_tuning, const ConfirmFn& confirm = nullptr);

// select() on the global cache, for launches on `stream`: TESSEL_AUTOTUNE=0 -> fallback;
// during CUDA graph capture of `stream` -> cached entry or fallback, never measures.
int select_for_stream(cudaStream_t stream, const std::string& key,
                      const std::vector<int>& candidates, int fallback, const MeasureFn& measure,
                      const ConfirmFn& confirm = nullptr);

// Times fn() on `stream`: `warmup` untimed runs, then the median of `iters` runs, each with
// the L2 flushed first (a read of 2x the L2 size, leaving clean lines; TESSEL_AUTOTUNE_FLUSH=
// memset: a memset instead) and bracketed by CUDA events.
// Synchronizes the stream. Throws tessel::Error on a CUDA error.
double time_on_stream(cudaStream_t stream, const std::function<void()>& fn, int warmup = 1,
                      int iters = 5);

// Ahead-of-time tuning (`tessel tune`): a family registers a function that tunes a list of
// shapes (empty list: the family's default shapes) and prints one line per key.
using PretuneFn = std::function<void(const std::vector<std::vector<int64_t>>& shapes,
                                     std::vector<std::string>& report)>;
void register_pretune(const std::string& family, PretuneFn fn);
std::vector<std::string> pretune_families();
// Runs the family's pretune function (throws tessel::Error for an unknown family).
std::vector<std::string> pretune(const std::string& family,
                                 const std::vector<std::vector<int64_t>>& shapes);
// "16x4096x4096,1x6144x4096" -> {{16,4096,4096},{1,6144,4096}}; throws tessel::Error.
std::vector<std::vector<int64_t>> parse_shapes(const std::string& text);

}  // namespace tessel::autotune
