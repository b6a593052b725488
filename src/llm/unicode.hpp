// Unicode support for the tokenizer: UTF-8 decoding, the character classes of the pre-tokenizer
// regexes (\p{L}, \p{N}, \s) and NFC normalization. Tables: src/llm/unicode_tables.cpp, generated
// by tools/gen_unicode_tables.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessel::llm {

namespace unicode_data {
extern const uint32_t kLetter[][2];
extern const size_t kLetterCount;
extern const uint32_t kNumber[][2];
extern const size_t kNumberCount;
extern const uint32_t kCombiningClass[][3];
extern const size_t kCombiningClassCount;
extern const uint32_t kDecomposition[][3];
extern const size_t kDecompositionCount;
extern const uint32_t kComposition[][3];
extern const size_t kCompositionCount;
}  // namespace unicode_data

namespace unicode {

// Decodes the code point at s[pos]; sets `len` to its byte length. An invalid or truncated
// sequence decodes as U+FFFD of length 1, so every byte is consumed exactly once.
uint32_t decode_utf8(std::string_view s, size_t pos, size_t& len);
void append_utf8(std::string& out, uint32_t cp);

bool is_letter(uint32_t cp);        // \p{L}
bool is_number(uint32_t cp);        // \p{N}
bool is_whitespace(uint32_t cp);    // \s (Unicode White_Space, as Oniguruma)
bool is_python_space(uint32_t cp);  // Python's str.isspace (Jinja's trim)
int combining_class(uint32_t cp);

// Canonical composition (NFC). Text whose code points are all below U+0300 is returned as is.
std::string nfc(std::string_view s);

// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view s);

}  // namespace unicode
}  // namespace tessel::llm
