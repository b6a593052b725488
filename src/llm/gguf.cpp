#include "llm/gguf.hpp"

#include <cstring>
#include <limits>

namespace tessel::llm {

namespace {

constexpr int kMaxArrayDepth = 4;
// Parsed values take ~90 bytes each: cap arrays (the largest real ones, vocabularies and merge
// lists, hold < 1M entries) so a corrupt length cannot ask for many GB.
constexpr uint64_t kMaxArrayLength = uint64_t{1} << 22;

[[noreturn]] void gguf_error(const std::string& label, const std::string& what, uint64_t offset,
                             const std::string& expected, const std::string& got) {
  file_error("gguf", label, "(" + what + " at byte " + std::to_string(offset) + ")", expected, got);
}

// Bounds-checked little-endian cursor over the file image.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& label) : p_(p), n_(n), label_(label) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  void need(uint64_t bytes, const char* what) const {
    if (bytes > remaining())
      gguf_error(label_, what, pos_, std::to_string(bytes) + " more bytes",
                 std::to_string(remaining()) + " (file truncated)");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }
  const std::string& label() const { return label_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& label_;
};

size_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean: return 1;
    case GgufValueType::u16:
    case GgufValueType::i16: return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32: return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64: return 8;
    case GgufValueType::string: return 8;
    case GgufValueType::array: return 12;
  }
  return 0;
}

GgufValue read_value(Reader& r, GgufValueType type, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::u8: v.u = r.read<uint8_t>("u8 value"); break;
    case GgufValueType::i8: v.i = r.read<int8_t>("i8 value"); break;
    case GgufValueType::u16: v.u = r.read<uint16_t>("u16 value"); break;
    case GgufValueType::i16: v.i = r.read<int16_t>("i16 value"); break;
    case GgufValueType::u32: v.u = r.read<uint32_t>("u32 value"); break;
    case GgufValueType::i32: v.i = r.read<int32_t>("i32 value"); break;
    case GgufValueType::u64: v.u = r.read<uint64_t>("u64 value"); break;
    case GgufValueType::i64: v.i = r.read<int64_t>("i64 value"); break;
    case GgufValueType::f32: v.f = r.read<float>("f32 value"); break;
    case GgufValueType::f64: v.f = r.read<double>("f64 value"); break;
    case GgufValueType::boolean: {
      const uint8_t b = r.read<uint8_t>("bool value");
      if (b > 1) gguf_error(r.label(), "bool value", r.pos() - 1, "0 or 1", std::to_string(b));
      v.u = b;
      break;
    }
    case GgufValueType::string: v.s = r.read_string("string value"); break;
    case GgufValueType::array: {
      if (depth >= kMaxArrayDepth)
        gguf_error(r.label(), "array nesting", r.pos(), "depth < " + std::to_string(kMaxArrayDepth),
                   std::to_string(depth));
      const uint32_t et = r.read<uint32_t>("array element type");
      if (et > static_cast<uint32_t>(GgufValueType::f64))
        gguf_error(r.label(), "array element type", r.pos() - 4, "a GGUF value type (0..12)",
                   std::to_string(et));
      v.elem_type = static_cast<GgufValueType>(et);
      const size_t count_pos = r.pos();
      const uint64_t n = r.read<uint64_t>("array length");
      // Every element needs at least min_value_bytes: reject absurd counts before allocating.
      if (n > r.remaining() / min_value_bytes(v.elem_type))
        gguf_error(r.label(), "array length", count_pos,
                   "at most " + std::to_string(r.remaining() / min_value_bytes(v.elem_type)) +
                       " elements (bytes left)",
                   std::to_string(n));
      if (n > kMaxArrayLength)
        gguf_error(r.label(), "array length", count_pos,
                   "at most " + std::to_string(kMaxArrayLength) + " elements", std::to_string(n));
      v.items.reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(r, v.elem_type, depth + 1));
      break;
    }
    default:
      gguf_error(r.label(), "value type", r.pos(), "a GGUF value type (0..12)",
                 std::to_string(static_cast<uint32_t>(type)));
  }
  return v;
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::u16:
    case GgufValueType::i16:
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::boolean: return true;
    default: return false;
  }
}
bool GgufValue::is_number() const {
  return is_integer() || type == GgufValueType::f32 || type == GgufValueType::f64;
}
int64_t GgufValue::as_int() const {
  switch (type) {
    case GgufValueType::i8:
    case GgufValueType::i16:
    case GgufValueType::i32:
    case GgufValueType::i64: return i;
    case GgufValueType::f32:
    case GgufValueType::f64: return static_cast<int64_t>(f);
    default: return static_cast<int64_t>(u);
  }
}
double GgufValue::as_double() const {
  if (type == GgufValueType::f32 || type == GgufValueType::f64) return f;
  return static_cast<double>(as_int());
}

const char* ggml_type_name(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: return "F32";
    case GgmlType::f16: return "F16";
    case GgmlType::q4_0: return "Q4_0";
    case GgmlType::q4_1: return "Q4_1";
    case GgmlType::q5_0: return "Q5_0";
    case GgmlType::q5_1: return "Q5_1";
    case GgmlType::q8_0: return "Q8_0";
    case GgmlType::q8_1: return "Q8_1";
    case GgmlType::q2_k: return "Q2_K";
    case GgmlType::q3_k: return "Q3_K";
    case GgmlType::q4_k: return "Q4_K";
    case GgmlType::q5_k: return "Q5_K";
    case GgmlType::q6_k: return "Q6_K";
    case GgmlType::q8_k: return "Q8_K";
    case GgmlType::bf16: return "BF16";
  }
  return "unknown";
}

GgmlBlock ggml_block(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: return {1, 4};
    case GgmlType::f16: return {1, 2};
    case GgmlType::bf16: return {1, 2};
    case GgmlType::q4_0: return {32, 18};
    case GgmlType::q4_1: return {32, 20};
    case GgmlType::q5_0: return {32, 22};
    case GgmlType::q5_1: return {32, 24};
    case GgmlType::q8_0: return {32, 34};
    case GgmlType::q8_1: return {32, 36};
    case GgmlType::q2_k: return {256, 84};
    case GgmlType::q3_k: return {256, 110};
    case GgmlType::q4_k: return {256, 144};
    case GgmlType::q5_k: return {256, 176};
    case GgmlType::q6_k: return {256, 210};
    case GgmlType::q8_k: return {256, 292};
  }
  return {0, 0};
}

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q4_K packs 8 six-bit (scale, min) pairs into 12 bytes.
void q4k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace

void dequantize_row(uint32_t type, const uint8_t* src, float* dst, int64_t n) {
  const GgmlBlock blk = ggml_block(type);
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case GgmlType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(load_u16(src + 2 * i));
      return;
    case GgmlType::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load_u16(src + 2 * i));
      return;
    case GgmlType::q8_0:
      for (int64_t b = 0; b < n / 32; ++b, src += blk.bytes, dst += 32) {
        const float d = half_to_float(load_u16(src));
        const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
        for (int j = 0; j < 32; ++j) dst[j] = d * q[j];
      }
      return;
    case GgmlType::q4_0:
      for (int64_t b = 0; b < n / 32; ++b, src += blk.bytes, dst += 32) {
        const float d = half_to_float(load_u16(src));
        const uint8_t* q = src + 2;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * ((q[j] & 0xF) - 8);
          dst[j + 16] = d * ((q[j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::q4_1:
      for (int64_t b = 0; b < n / 32; ++b, src += blk.bytes, dst += 32) {
        const float d = half_to_float(load_u16(src));
        const float m = half_to_float(load_u16(src + 2));
        const uint8_t* q = src + 4;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * (q[j] & 0xF) + m;
          dst[j + 16] = d * (q[j] >> 4) + m;
        }
      }
      return;
    case GgmlType::q4_k:
      for (int64_t b = 0; b < n / 256; ++b, src += blk.bytes) {
        const float d = half_to_float(load_u16(src));
        const float dmin = half_to_float(load_u16(src + 2));
        const uint8_t* scales = src + 4;
        const uint8_t* q = src + 16;
        for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
          uint8_t sc, m;
          q4k_scale_min(is, scales, sc, m);
          const float d1 = d * sc, m1 = dmin * m;
          q4k_scale_min(is + 1, scales, sc, m);
          const float d2 = d * sc, m2 = dmin * m;
          for (int l = 0; l < 32; ++l) *dst++ = d1 * (q[l] & 0xF) - m1;
          for (int l = 0; l < 32; ++l) *dst++ = d2 * (q[l] >> 4) - m2;
        }
      }
      return;
    case GgmlType::q6_k:
      for (int64_t b = 0; b < n / 256; ++b, src += blk.bytes) {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
        const float d = half_to_float(load_u16(src + 208));
        for (int half = 0; half < 2; ++half, dst += 128, ql += 64, qh += 32, sc += 8) {
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            dst[l] = d * sc[is] * q1;
            dst[l + 32] = d * sc[is + 2] * q2;
            dst[l + 64] = d * sc[is + 4] * q3;
            dst[l + 96] = d * sc[is + 6] * q4;
          }
        }
      }
      return;
    default:
      throw Error(TESSEL_ERROR_UNSUPPORTED,
                  std::string("tessel::gguf: 'tensor type' expected F32, F16, BF16, Q8_0, Q4_0, "
                              "Q4_1, Q4_K or Q6_K, got ") +
                      ggml_type_name(type) + " (" + std::to_string(type) + ")");
  }
}

GgufFile::GgufFile(const std::string& path) : file_(path), label_(path) {
  parse(file_.data(), file_.size());
}

GgufFile GgufFile::from_memory(const uint8_t* bytes, size_t size, const std::string& label) {
  GgufFile g;
  g.label_ = label;
  g.parse(bytes, size);
  return g;
}

void GgufFile::parse(const uint8_t* bytes, size_t size) {
  Reader r(bytes, size, label_);
  const uint32_t magic = r.read<uint32_t>("magic");
  if (magic != 0x46554747u)  // "GGUF" little-endian
    gguf_error(
        label_, "magic", 0, "\"GGUF\"", "0x" + [&] {
          char buf[16];
          std::snprintf(buf, sizeof buf, "%08x", magic);
          return std::string(buf);
        }());
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    gguf_error(label_, "version", 4, "2 or 3", std::to_string(version_));
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // A tensor info takes >= 24 bytes and a KV pair >= 13: bound the counts by the file size.
  if (n_tensors > r.remaining() / 24)
    gguf_error(label_, "tensor count", 8, "at most " + std::to_string(r.remaining() / 24),
               std::to_string(n_tensors));
  if (n_kv > r.remaining() / 13)
    gguf_error(label_, "metadata count", 16, "at most " + std::to_string(r.remaining() / 13),
               std::to_string(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.read_string("metadata key");
    const size_t type_pos = r.pos();
    const uint32_t t = r.read<uint32_t>("metadata value type");
    if (t > static_cast<uint32_t>(GgufValueType::f64))
      gguf_error(label_, "value type of '" + key + "'", type_pos, "a GGUF value type (0..12)",
                 std::to_string(t));
    GgufValue v = read_value(r, static_cast<GgufValueType>(t), 0);
    kv_[std::move(key)] = std::move(v);
  }
  if (const GgufValue* a = find("general.alignment")) {
    const int64_t al = a->is_integer() ? a->as_int() : 0;
    if (al <= 0 || (al & (al - 1)) != 0)
      gguf_error(label_, "general.alignment", 0, "a power of two",
                 a->is_integer() ? std::to_string(al) : "a non-integer");
    alignment_ = static_cast<uint64_t>(al);
  }
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo ti;
    ti.name = r.read_string("tensor name");
    const size_t dims_pos = r.pos();
    const uint32_t n_dims = r.read<uint32_t>("tensor rank");
    if (n_dims < 1 || n_dims > 4)
      gguf_error(label_, "rank of tensor '" + ti.name + "'", dims_pos, "1..4",
                 std::to_string(n_dims));
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > (uint64_t{1} << 40) || numel > (uint64_t{1} << 40) / ne)
        gguf_error(label_, "dimension " + std::to_string(d) + " of tensor '" + ti.name + "'",
                   r.pos() - 8, "1..2^40 elements in all", std::to_string(ne));
      numel *= ne;
      ti.ne.push_back(ne);
    }
    const size_t type_pos = r.pos();
    ti.type = r.read<uint32_t>("tensor type");
    const GgmlBlock blk = ggml_block(ti.type);
    if (blk.elems == 0)
      gguf_error(label_, "type of tensor '" + ti.name + "'", type_pos, "a ggml type",
                 std::to_string(ti.type));
    if (ti.ne[0] % static_cast<uint64_t>(blk.elems) != 0)
      gguf_error(label_, "row length of tensor '" + ti.name + "'", dims_pos,
                 "a multiple of " + std::to_string(blk.elems) + " for " + ggml_type_name(ti.type),
                 std::to_string(ti.ne[0]));
    ti.nbytes = numel / static_cast<uint64_t>(blk.elems) * static_cast<uint64_t>(blk.bytes);
    const size_t off_pos = r.pos();
    ti.offset = r.read<uint64_t>("tensor offset");
    if (ti.offset % alignment_ != 0)
      gguf_error(label_, "offset of tensor '" + ti.name + "'", off_pos,
                 "a multiple of the alignment " + std::to_string(alignment_),
                 std::to_string(ti.offset));
    if (index_.count(ti.name))
      gguf_error(label_, "tensor name", dims_pos, "unique names", "'" + ti.name + "' twice");
    index_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }
  const uint64_t data_start = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensorInfo& ti : tensors_) {
    if (ti.offset > size || data_start > size - ti.offset ||
        ti.nbytes > size - data_start - ti.offset)
      gguf_error(
          label_, "data of tensor '" + ti.name + "'", data_start + ti.offset,
          std::to_string(ti.nbytes) + " bytes inside the file (size " + std::to_string(size) + ")",
          "a range past the end (file truncated?)");
    ti.data = bytes + data_start + ti.offset;
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (v->type != GgufValueType::string)
    file_error("gguf", label_, "(metadata '" + key + "')", "a string",
               "value type " + std::to_string(static_cast<uint32_t>(v->type)));
  return v->s;
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer())
    file_error("gguf", label_, "(metadata '" + key + "')", "an integer",
               "value type " + std::to_string(static_cast<uint32_t>(v->type)));
  return v->as_int();
}

double GgufFile::get_double(const std::string& key, double fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_number())
    file_error("gguf", label_, "(metadata '" + key + "')", "a number",
               "value type " + std::to_string(static_cast<uint32_t>(v->type)));
  return v->as_double();
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (!v->is_integer())
    file_error("gguf", label_, "(metadata '" + key + "')", "a bool",
               "value type " + std::to_string(static_cast<uint32_t>(v->type)));
  return v->as_int() != 0;
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<int64_t> GgufFile::shape(const std::string& name) const {
  const GgufTensorInfo* ti = tensor(name);
  if (!ti) file_error("gguf", label_, "", "a tensor named '" + name + "'", "none");
  return {ti->ne.rbegin(), ti->ne.rend()};
}

HostTensor GgufFile::load(const std::string& name) const {
  const GgufTensorInfo* ti = tensor(name);
  if (!ti) file_error("gguf", label_, "", "a tensor named '" + name + "'", "none");
  HostTensor t;
  t.shape.assign(ti->ne.rbegin(), ti->ne.rend());
  t.data.resize(static_cast<size_t>(t.numel()));
  dequantize_row(ti->type, ti->data, t.data.data(), t.numel());
  return t;
}

std::vector<std::string> GgufFile::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

TokenizerData GgufFile::tokenizer_data() const {
  TokenizerData td;
  td.model = get_string("tokenizer.ggml.model");
  td.pre = get_string("tokenizer.ggml.pre");
  auto strings = [&](const std::string& key) {
    std::vector<std::string> out;
    const GgufValue* v = find(key);
    if (!v) return out;
    if (v->type != GgufValueType::array || v->elem_type != GgufValueType::string)
      file_error("gguf", label_, "(metadata '" + key + "')", "an array of strings",
                 "value type " + std::to_string(static_cast<uint32_t>(v->type)));
    out.reserve(v->items.size());
    for (const GgufValue& s : v->items) out.push_back(s.s);
    return out;
  };
  td.tokens = strings("tokenizer.ggml.tokens");
  td.merges = strings("tokenizer.ggml.merges");
  if (const GgufValue* v = find("tokenizer.ggml.token_type")) {
    if (v->type != GgufValueType::array || !GgufValue{v->elem_type}.is_integer())
      file_error("gguf", label_, "(metadata 'tokenizer.ggml.token_type')", "an integer array",
                 "value type " + std::to_string(static_cast<uint32_t>(v->type)));
    for (const GgufValue& x : v->items) td.token_types.push_back(static_cast<int32_t>(x.as_int()));
  }
  td.bos_id = static_cast<int32_t>(get_int("tokenizer.ggml.bos_token_id", -1));
  td.eos_id = static_cast<int32_t>(get_int("tokenizer.ggml.eos_token_id", -1));
  if (td.eos_id >= 0) td.eos_ids.push_back(td.eos_id);
  const int64_t eot = get_int("tokenizer.ggml.eot_token_id", -1);
  if (eot >= 0 && eot != td.eos_id) td.eos_ids.push_back(static_cast<int32_t>(eot));
  td.add_bos = get_bool("tokenizer.ggml.add_bos_token", false);
  td.chat_template = get_string("tokenizer.chat_template");
  const int64_t n = static_cast<int64_t>(td.tokens.size());
  auto check_id = [&](int32_t id, const char* key) {
    if (id >= n)
      file_error("gguf", label_, std::string("(metadata '") + key + "')",
                 "a token id < " + std::to_string(n), std::to_string(id));
  };
  check_id(td.bos_id, "tokenizer.ggml.bos_token_id");
  check_id(td.eos_id, "tokenizer.ggml.eos_token_id");
  return td;
}

}  // namespace tessel::llm
