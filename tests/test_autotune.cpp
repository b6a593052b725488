// Autotuner (src/runtime/autotune.hpp), CPU only: buckets and keys, the JSON cache (load,
// save, merge, malformed and unwritable files -> warning, never a crash), environment
// overrides, selection with fake measurements, thread safety, `tessel tune` shape parsing.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/autotune.hpp"
#include "tessel/tensor.hpp"
#include "test_util.hpp"

namespace tessel::autotune {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("tessel-autotune-" + std::to_string(rd()) + "-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path file(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

using test::ScopedEnv;

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Autotune, BucketGrid) {
  EXPECT_EQ(bucket(0), 1);
  EXPECT_EQ(bucket(1), 1);
  EXPECT_EQ(bucket(2), 2);
  EXPECT_EQ(bucket(3), 3);
  EXPECT_EQ(bucket(5), 6);
  EXPECT_EQ(bucket(7), 8);
  EXPECT_EQ(bucket(16), 16);
  EXPECT_EQ(bucket(17), 24);
  EXPECT_EQ(bucket(32), 32);
  EXPECT_EQ(bucket(4096), 4096);
  EXPECT_EQ(bucket(4104), 6144);
  EXPECT_EQ(bucket(6144), 6144);
  EXPECT_EQ(bucket(14336), 16384);
  EXPECT_EQ(bucket(28672), 32768);
  EXPECT_EQ(bucket(128256), 131072);
}

TEST(Autotune, KeyNamesEveryField) {
  const std::string k = make_key("fam", "NVIDIA H100", "bf16->f32", "nk", 3, 4104, 520);
  EXPECT_EQ(k, "fam|NVIDIA H100|bf16->f32|nk|m3|n6144|k768");
  EXPECT_EQ(make_key("fam", "g", "d", "l", 4, 4096, 4096),
            make_key("fam", "g", "d", "l", 4, 4000, 4000));
  EXPECT_NE(make_key("fam", "g", "d", "l", 4, 4096, 4096),
            make_key("fam", "g2", "d", "l", 4, 4096, 4096));
}

TEST(Autotune, ParseAndSerializeRoundTrip) {
  std::map<std::string, Entry> in{{"a|b", {3, 0.5}}, {"c", {-1, 2.0}}};
  std::map<std::string, Entry> out;
  std::string why;
  ASSERT_TRUE(Cache::parse(Cache::serialize(in), out, why)) << why;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out["a|b"].config, 3);
  EXPECT_DOUBLE_EQ(out["a|b"].ms, 0.5);
  EXPECT_EQ(out["c"].config, -1);
}

TEST(Autotune, ParseRejectsMalformedDocuments) {
  const char* bad[] = {
      "",
      "{",
      "[1, 2]",
      "{\"entries\": {}}",
      "{\"version\": 2, \"entries\": {}}",
      "{\"version\": \"1\", \"entries\": {}}",
      "{\"version\": 1}",
      "{\"version\": 1, \"entries\": []}",
      "{\"version\": 1, \"entries\": {\"k\": 3}}",
      "{\"version\": 1, \"entries\": {\"k\": {\"ms\": 1.0}}}",
      "{\"version\": 1, \"entries\": {\"k\": {\"config\": 1.5}}}",
      "{\"version\": 1, \"entries\": {\"k\": {\"config\": 99999999999}}}",
      "\xff\xfe garbage",
  };
  for (const char* text : bad) {
    std::map<std::string, Entry> out;
    std::string why;
    EXPECT_FALSE(Cache::parse(text, out, why)) << text;
    EXPECT_FALSE(why.empty()) << text;
  }
}

TEST(Autotune, MissingFileIsEmptyAndPutCreatesIt) {
  TempDir dir;
  const fs::path p = dir.file("sub/dir/autotune.json");
  Cache c(p.string());
  EXPECT_EQ(c.size(), 0u);
  EXPECT_FALSE(c.find("k").has_value());
  EXPECT_TRUE(c.last_warning().empty());
  c.put("k", {5, 0.25});
  ASSERT_TRUE(fs::exists(p));
  Cache again(p.string());
  ASSERT_TRUE(again.find("k").has_value());
  EXPECT_EQ(again.find("k")->config, 5);
  EXPECT_DOUBLE_EQ(again.find("k")->ms, 0.25);
}

TEST(Autotune, MalformedFileIsIgnoredWithWarningThenRewritten) {
  TempDir dir;
  const fs::path p = dir.file("autotune.json");
  write(p, "{ this is not json");
  Cache c(p.string());
  EXPECT_NO_THROW(EXPECT_EQ(c.size(), 0u));
  EXPECT_NE(c.last_warning().find("malformed"), std::string::npos) << c.last_warning();
  EXPECT_NE(c.last_warning().find(p.string()), std::string::npos) << c.last_warning();
  c.put("k", {2, 1.0});
  std::map<std::string, Entry> out;
  std::string why;
  EXPECT_TRUE(Cache::parse(read(p), out, why)) << why;
  EXPECT_EQ(out.size(), 1u);
}

TEST(Autotune, WrongTypesInFileAreIgnored) {
  TempDir dir;
  const fs::path p = dir.file("autotune.json");
  write(p, "{\"version\": 1, \"entries\": {\"k\": {\"config\": \"three\"}}}");
  Cache c(p.string());
  EXPECT_FALSE(c.find("k").has_value());
  EXPECT_FALSE(c.last_warning().empty());
}

TEST(Autotune, UnwritablePathWarnsAndKeepsMemory) {
  TempDir dir;
  const fs::path blocker = dir.file("file");
  write(blocker, "x");  // a file where a directory would have to be
  Cache c((blocker / "autotune.json").string());
  EXPECT_NO_THROW(c.put("k", {1, 1.0}));
  EXPECT_FALSE(c.last_warning().empty());
  ASSERT_TRUE(c.find("k").has_value());
  EXPECT_EQ(c.find("k")->config, 1);
}

TEST(Autotune, MemoryOnlyCache) {
  Cache c("");
  c.put("k", {4, 1.0});
  EXPECT_EQ(c.find("k")->config, 4);
  EXPECT_TRUE(c.last_warning().empty());
}

TEST(Autotune, SavesMergeWithOtherWriters) {
  TempDir dir;
  const std::string p = dir.file("autotune.json").string();
  Cache a(p), b(p);
  a.put("ka", {1, 1.0});
  b.put("kb", {2, 2.0});  // b loaded before a saved? it merges with the file on save
  Cache c(p);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.find("ka")->config, 1);
  EXPECT_EQ(c.find("kb")->config, 2);
}

TEST(Autotune, SelectMeasuresOnceThenUsesCache) {
  TempDir dir;
  Cache cache(dir.file("autotune.json").string());
  const std::vector<int> cands{0, 1, 2, 3};
  int calls = 0;
  auto measure = [&](int c) {
    ++calls;
    return c == 2 ? 0.5 : 1.0 + c;
  };
  EXPECT_EQ(select(cache, "k", cands, 0, measure, true), 2);
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(select(cache, "k", cands, 0, measure, true), 2);
  EXPECT_EQ(calls, 4);
  // From disk, in a new process-like cache object.
  Cache reloaded(dir.file("autotune.json").string());
  EXPECT_EQ(select(reloaded, "k", cands, 0, measure, true), 2);
  EXPECT_EQ(calls, 4);
}

TEST(Autotune, SelectWithoutTuningUsesFallbackOrCache) {
  Cache cache("");
  int calls = 0;
  auto measure = [&](int) {
    ++calls;
    return 1.0;
  };
  EXPECT_EQ(select(cache, "k", {0, 1, 2}, 1, measure, false), 1);
  EXPECT_EQ(calls, 0);
  cache.put("k", {2, 0.1});
  EXPECT_EQ(select(cache, "k", {0, 1, 2}, 1, measure, false), 2);
}

// A confirm step sees only a winner other than the fallback; what it keeps is stored.
TEST(Autotune, ConfirmCanKeepTheFallback) {
  auto measure = [](int c) { return c == 2 ? 0.1 : 0.2; };  // 2 wins the pass
  int confirms = 0;
  Cache keep_fallback("");
  EXPECT_EQ(select(keep_fallback, "k", {0, 1, 2}, 1, measure, true,
                   [&](int best, int fallback) {
                     ++confirms;
                     EXPECT_EQ(best, 2);
                     EXPECT_EQ(fallback, 1);
                     return fallback;
                   }),
            1);
  EXPECT_EQ(keep_fallback.find("k")->config, 1);
  EXPECT_DOUBLE_EQ(keep_fallback.find("k")->ms, 0.2);
  Cache keep_best("");
  EXPECT_EQ(select(keep_best, "k", {0, 1, 2}, 1, measure, true,
                   [&](int best, int) {
                     ++confirms;
                     return best;
                   }),
            2);
  EXPECT_EQ(keep_best.find("k")->config, 2);
  Cache fallback_wins("");
  EXPECT_EQ(select(fallback_wins, "k", {0, 1, 2}, 2, measure, true,
                   [&](int best, int) {
                     ++confirms;
                     return best;
                   }),
            2);
  EXPECT_EQ(confirms, 2) << "confirm ran although the fallback won the pass";
  Cache throws("");
  EXPECT_EQ(select(throws, "k", {0, 1, 2}, 1, measure, true,
                   [](int, int) -> int { throw std::runtime_error("no"); }),
            2);
}

TEST(Autotune, StaleCachedConfigIsRetuned) {
  Cache cache("");
  cache.put("k", {7, 0.1});  // not among today's candidates
  EXPECT_EQ(select(
                cache, "k", {0, 1}, 0, [](int c) { return c == 1 ? 0.1 : 0.2; }, true),
            1);
  EXPECT_EQ(cache.find("k")->config, 1);
}

TEST(Autotune, FailingCandidatesAreSkipped) {
  Cache cache("");
  auto measure = [](int c) -> double {
    if (c == 0) throw Error(TESSEL_ERROR_CUDA, "launch failed");
    if (c == 1) return -1.0;
    return 3.0;
  };
  EXPECT_EQ(select(cache, "k", {0, 1, 2}, 0, measure, true), 2);
  // Nothing measurable: the fallback, and nothing is cached.
  EXPECT_EQ(select(
                cache, "k2", {0, 1}, 1, [](int) -> double { return -1.0; }, true),
            1);
  EXPECT_FALSE(cache.find("k2").has_value());
}

TEST(Autotune, ConcurrentSelectTunesOnce) {
  Cache cache("");
  std::atomic<int> calls{0};
  auto measure = [&](int c) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return 10.0 - c;
  };
  std::vector<std::thread> threads;
  std::vector<int> got(8, -1);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] { got[i] = select(cache, "k", {0, 1, 2, 3}, 0, measure, true); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls.load(), 4);
  for (int g : got) EXPECT_EQ(g, 3);
}

TEST(Autotune, EnvironmentOverrides) {
  {
    ScopedEnv on("TESSEL_AUTOTUNE", nullptr);
    EXPECT_TRUE(enabled());
  }
  {
    ScopedEnv off("TESSEL_AUTOTUNE", "0");
    EXPECT_FALSE(enabled());
    // Disabled: the fallback, without touching CUDA or the cache.
    EXPECT_EQ(select_for_stream(nullptr, "k", {0, 1}, 1, [](int) { return 0.0; }), 1);
  }
  {
    ScopedEnv one("TESSEL_AUTOTUNE", "1");
    EXPECT_TRUE(enabled());
  }
  TempDir dir;
  const std::string p = dir.file("override.json").string();
  {
    ScopedEnv path("TESSEL_AUTOTUNE_CACHE", p.c_str());
    EXPECT_EQ(default_cache_path(), p);
    EXPECT_EQ(global_cache().path(), p);
    global_cache().put("env-key", {3, 1.0});
    EXPECT_TRUE(fs::exists(p));
  }
  {
    ScopedEnv path("TESSEL_AUTOTUNE_CACHE", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/home/someone");
    EXPECT_EQ(default_cache_path(), "/home/someone/.cache/tessel/autotune.json");
    ScopedEnv xdg2("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_cache_path(), "/xdg/tessel/autotune.json");
  }
}

TEST(Autotune, ParseShapes) {
  const auto s = parse_shapes("16x4096x4096,1x6144x4096");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], (std::vector<int64_t>{16, 4096, 4096}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 6144, 4096}));
  EXPECT_TRUE(parse_shapes("").empty());
  EXPECT_THROW(parse_shapes("16x4096"), Error);
  EXPECT_THROW(parse_shapes("16xax4096"), Error);
  EXPECT_THROW(parse_shapes("0x8x8"), Error);
}

TEST(Autotune, PretuneUnknownFamilyThrows) {
  EXPECT_THROW(pretune("no-such-family", {}), Error);
  // The small-M GEMM registers itself when libtessel loads.
  const auto fams = pretune_families();
  EXPECT_NE(std::find(fams.begin(), fams.end(), "gemm_small_m"), fams.end());
}

}  // namespace
}  // namespace tessel::autotune
