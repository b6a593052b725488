#include "llm/unicode.hpp"

#include <algorithm>
#include <array>
#include <vector>

namespace tessel::llm::unicode {
namespace {

using namespace unicode_data;

bool in_ranges(const uint32_t (*table)[2], size_t count, uint32_t cp) {
  size_t lo = 0, hi = count;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (table[mid][1] < cp) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < count && table[lo][0] <= cp;
}

// Latin-1 answers from a table: most text is ASCII and the binary search is the slow path.
struct Latin1Classes {
  std::array<uint8_t, 256> flags{};
  Latin1Classes() {
    for (uint32_t cp = 0; cp < 256; ++cp) {
      flags[cp] = (in_ranges(kLetter, kLetterCount, cp) ? 1 : 0) |
                  (in_ranges(kNumber, kNumberCount, cp) ? 2 : 0);
    }
  }
};
const Latin1Classes& latin1() {
  static const Latin1Classes classes;
  return classes;
}

constexpr uint32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr uint32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr uint32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr uint32_t kHangulSCount = kHangulLCount * kHangulNCount;

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kHangulS && cp < kHangulS + kHangulSCount) {
    const uint32_t s = cp - kHangulS;
    out.push_back(kHangulL + s / kHangulNCount);
    out.push_back(kHangulV + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulT + s % kHangulTCount);
    return;
  }
  const auto* end = kDecomposition + kDecompositionCount;
  const auto* it = std::lower_bound(kDecomposition, end, cp,
                                    [](const uint32_t(&row)[3], uint32_t v) { return row[0] < v; });
  if (it == end || (*it)[0] != cp) {
    out.push_back(cp);
    return;
  }
  decompose((*it)[1], out);
  if ((*it)[2] != 0) decompose((*it)[2], out);
}

// The primary composite of (first, second), or 0.
uint32_t compose(uint32_t first, uint32_t second) {
  if (first >= kHangulL && first < kHangulL + kHangulLCount && second >= kHangulV &&
      second < kHangulV + kHangulVCount) {
    return kHangulS + ((first - kHangulL) * kHangulVCount + (second - kHangulV)) * kHangulTCount;
  }
  if (first >= kHangulS && first < kHangulS + kHangulSCount &&
      (first - kHangulS) % kHangulTCount == 0 && second > kHangulT &&
      second < kHangulT + kHangulTCount) {
    return first + (second - kHangulT);
  }
  const auto* end = kComposition + kCompositionCount;
  const auto* it =
      std::lower_bound(kComposition, end, std::pair<uint32_t, uint32_t>{first, second},
                       [](const uint32_t(&row)[3], const std::pair<uint32_t, uint32_t>& v) {
                         return row[0] < v.first || (row[0] == v.first && row[1] < v.second);
                       });
  if (it == end || (*it)[0] != first || (*it)[1] != second) return 0;
  return (*it)[2];
}

// Length of the valid prefix of a UTF-8 sequence at s[pos] (Unicode's "maximal subpart"), and
// whether it is complete.
size_t utf8_prefix(std::string_view s, size_t pos, bool& complete) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const uint8_t lead = b(0);
  complete = true;
  if (lead < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    complete = false;
    return 1;
  }
  size_t len = 1;
  while (len < need) {
    if (pos + len >= s.size()) break;
    const uint8_t c = b(len);
    const uint8_t l = len == 1 ? lo : 0x80, h = len == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
    ++len;
  }
  complete = len == need;
  return len;
}

}  // namespace

uint32_t decode_utf8(std::string_view s, size_t pos, size_t& len) {
  const auto lead = static_cast<uint8_t>(s[pos]);
  if (lead < 0x80) {
    len = 1;
    return lead;
  }
  bool complete = false;
  const size_t n = utf8_prefix(s, pos, complete);
  if (!complete) {
    len = 1;
    return 0xFFFD;
  }
  len = n;
  uint32_t cp = n == 2 ? (lead & 0x1F) : n == 3 ? (lead & 0x0F) : (lead & 0x07);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_letter(uint32_t cp) {
  if (cp < 256) return latin1().flags[cp] & 1;
  return in_ranges(kLetter, kLetterCount, cp);
}

bool is_number(uint32_t cp) {
  if (cp < 256) return latin1().flags[cp] & 2;
  return in_ranges(kNumber, kNumberCount, cp);
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_python_space(uint32_t cp) { return is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

int combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = kCombiningClass + kCombiningClassCount;
  const auto* it = std::lower_bound(kCombiningClass, end, cp,
                                    [](const uint32_t(&row)[3], uint32_t v) { return row[1] < v; });
  if (it == end || (*it)[0] > cp) return 0;
  return static_cast<int>((*it)[2]);
}

std::string nfc(std::string_view s) {
  std::vector<uint32_t> cps;
  bool all_below = true;
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    const uint32_t cp = decode_utf8(s, pos, len);
    if (cp >= 0x300) all_below = false;
    decompose(cp, cps);
  }
  if (all_below) return std::string(s);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](uint32_t a, uint32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  // Canonical composition (the algorithm of UAX #15).
  if (!cps.empty()) {
    size_t starter = 0, out = 1;
    int last_class = combining_class(cps[0]);
    if (last_class != 0) last_class = 256;  // a leading non-starter blocks everything after it
    for (size_t i = 1; i < cps.size(); ++i) {
      const uint32_t cp = cps[i];
      const int cls = combining_class(cp);
      const uint32_t composite = compose(cps[starter], cp);
      if (composite != 0 && (last_class < cls || last_class == 0)) {
        cps[starter] = composite;
        continue;
      }
      if (cls == 0) starter = out;
      last_class = cls;
      cps[out++] = cp;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(s.size());
  for (uint32_t cp : cps) append_utf8(result, cp);
  return result;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    bool complete = false;
    const size_t n = utf8_prefix(s, pos, complete);
    if (complete) {
      out.append(s.substr(pos, n));
    } else {
      out += "\xEF\xBF\xBD";
    }
    pos += n;
  }
  return out;
}

}  // namespace tessel::llm::unicode
