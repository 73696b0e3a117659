#include "delta/codec.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace wsync::delta {
namespace {

constexpr uint32_t kMagic = 0x31445357;  // "WSD1" read as a little-endian u32

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

uint64_t Chunks(uint64_t elements) { return (elements + kChunkElements - 1) / kChunkElements; }
uint64_t ChunkLength(uint64_t elements, uint64_t c) { return std::min(kChunkElements, elements - c * kChunkElements); }
uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
uint64_t BitmapWords(uint64_t n) { return (n + 15) / 16; }
bool ValidElem(uint32_t e) { return e == 1 || e == 2 || e == 4; }

// A chunk of n elements with k changes says where they are with a bitmap
// when that is smaller than k indices.
bool UsesBitmap(uint64_t k, uint64_t n) { return k > BitmapWords(n); }
uint64_t WhereBytes(uint64_t k, uint64_t n) { return 2 * (UsesBitmap(k, n) ? BitmapWords(n) : k); }

// Bit 8*e*l of the result is set where lane l (an element of e bytes) of
// the 8-byte word difference `d` is non-zero.
uint64_t LaneBits(uint64_t d, uint32_t e) {
  if (e == 1) {
    d |= d >> 4;
    d |= d >> 2;
    d |= d >> 1;
    return d & 0x0101010101010101ull;
  }
  if (e == 2) {
    d |= d >> 8;
    d |= d >> 4;
    d |= d >> 2;
    d |= d >> 1;
    return d & 0x0001000100010001ull;
  }
  return ((d & 0xffffffffull) ? 1ull : 0ull) | ((d >> 32) ? 1ull << 32 : 0ull);
}

void CopyElement(uint8_t* dst, const uint8_t* src, uint32_t e) {
  switch (e) {
    case 1: *dst = *src; break;
    case 2: std::memcpy(dst, src, 2); break;
    default: std::memcpy(dst, src, 4); break;
  }
}

// The changed elements of one chunk (n elements): their indices into
// `found`, and `base` advanced to `next` over them.
void FindChanges(uint8_t* b, const uint8_t* x, uint64_t n, uint32_t e, std::vector<uint16_t>& found) {
  const uint64_t per_word = 8 / e;
  const uint64_t words = n / per_word;
  auto word = [&](uint64_t w) {
    const uint64_t d = Load<uint64_t>(b + 8 * w) ^ Load<uint64_t>(x + 8 * w);
    if (d == 0) return;
    std::memcpy(b + 8 * w, x + 8 * w, 8);
    for (uint64_t lanes = LaneBits(d, e); lanes != 0; lanes &= lanes - 1) {
      found.push_back(static_cast<uint16_t>(w * per_word + static_cast<uint64_t>(__builtin_ctzll(lanes)) / (8 * e)));
    }
  };
  uint64_t w = 0;
  for (; w + 4 <= words; w += 4) {  // 32 bytes at a time: most are equal
    uint64_t any = 0;
    for (uint64_t j = 0; j < 4; ++j) any |= Load<uint64_t>(b + 8 * (w + j)) ^ Load<uint64_t>(x + 8 * (w + j));
    if (any == 0) continue;
    for (uint64_t j = 0; j < 4; ++j) word(w + j);
  }
  for (; w < words; ++w) word(w);
  for (uint64_t i = words * per_word; i < n; ++i) {
    if (std::memcmp(b + i * e, x + i * e, e) != 0) {
      CopyElement(b + i * e, x + i * e, e);
      found.push_back(static_cast<uint16_t>(i));
    }
  }
}
}  // namespace

uint64_t Layout::chunk_length(uint64_t c) const { return ChunkLength(elements, c); }
bool Layout::bitmap(uint64_t c) const { return UsesBitmap(counts[c], chunk_length(c)); }
uint64_t Layout::where_bytes(uint64_t c) const { return WhereBytes(counts[c], chunk_length(c)); }

uint64_t HeadBytes(uint64_t elements) { return kHeaderBytes + 4 * Chunks(elements); }

Layout LayoutOf(uint64_t elements, uint32_t elem_bytes, std::vector<uint32_t> counts) {
  Layout l;
  l.elem_bytes = elem_bytes;
  l.elements = elements;
  l.counts = std::move(counts);
  l.where_at.resize(l.chunks());
  l.first_value.resize(l.chunks());
  uint64_t at = HeadBytes(elements);
  for (uint64_t c = 0; c < l.chunks(); ++c) {
    l.where_at[c] = at;
    l.first_value[c] = l.changes;
    at += l.where_bytes(c);
    l.changes += l.counts[c];
  }
  l.values_at = AlignUp(at, elem_bytes);
  l.bytes = l.values_at + l.changes * elem_bytes;
  return l;
}

void WriteHead(const Layout& l, uint8_t* out) {
  std::memset(out, 0, kHeaderBytes);
  Store<uint32_t>(out, kMagic);
  out[4] = static_cast<uint8_t>(l.elem_bytes);
  Store<uint64_t>(out + 8, l.elements);
  Store<uint64_t>(out + 16, l.changes);
  Store<uint32_t>(out + 24, static_cast<uint32_t>(l.chunks()));
  for (uint64_t c = 0; c < l.chunks(); ++c) Store<uint32_t>(out + kHeaderBytes + 4 * c, l.counts[c]);
}

uint64_t ElementsOf(const uint8_t* header) {
  return Load<uint32_t>(header) == kMagic ? Load<uint64_t>(header + 8) : 0;
}

StatusOr<Encoded> EncodeAndAdvance(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                   uint8_t* out, uint64_t capacity) {
  if (!ValidElem(elem_bytes) || size % elem_bytes != 0) {
    return InvalidArgument("delta encode: " + std::to_string(size) + " bytes are not whole elements of " +
                           std::to_string(elem_bytes) + " bytes (1, 2 or 4)");
  }
  const uint64_t elements = size / elem_bytes;
  const uint64_t chunks = Chunks(elements);
  // Where-areas go straight to `out`; values collect here and follow them.
  thread_local std::vector<uint8_t> values;
  values.clear();
  thread_local std::vector<uint16_t> found;  // one chunk's changed indices
  std::vector<uint32_t> counts(chunks);
  uint64_t at = HeadBytes(elements);  // the next where-area
  bool fits = at <= capacity;

  Encoded r;
  for (uint64_t c = 0; c < chunks; ++c) {
    const uint64_t n = ChunkLength(elements, c);
    uint8_t* b = base + c * kChunkElements * elem_bytes;
    const uint8_t* x = next + c * kChunkElements * elem_bytes;
    found.clear();
    FindChanges(b, x, n, elem_bytes, found);
    const uint64_t k = found.size();
    counts[c] = static_cast<uint32_t>(k);
    r.changes += k;
    const uint64_t where = WhereBytes(k, n);
    fits = fits && AlignUp(at + where, elem_bytes) + values.size() + k * elem_bytes <= capacity;
    if (!fits) continue;  // keep advancing base; the delta is abandoned
    if (UsesBitmap(k, n)) {
      std::memset(out + at, 0, where);
      for (uint16_t i : found) out[at + i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    } else {
      for (uint64_t j = 0; j < k; ++j) Store<uint16_t>(out + at + 2 * j, found[j]);
    }
    at += where;
    const size_t v0 = values.size();
    values.resize(v0 + k * elem_bytes);
    for (uint64_t j = 0; j < k; ++j) CopyElement(&values[v0 + j * elem_bytes], x + found[j] * elem_bytes, elem_bytes);
  }
  if (!fits) return r;
  const Layout layout = LayoutOf(elements, elem_bytes, std::move(counts));
  if (layout.bytes > capacity) return r;
  WriteHead(layout, out);
  std::memset(out + at, 0, layout.values_at - at);  // the pad: equal deltas are equal bytes
  if (!values.empty()) std::memcpy(out + layout.values_at, values.data(), values.size());
  r.fits = true;
  r.bytes = layout.bytes;
  return r;
}

StatusOr<Layout> ReadLayout(const uint8_t* head, uint64_t head_bytes, uint64_t delta_bytes, uint64_t size,
                            const char* what) {
  auto bad = [&](const std::string& why) {
    return DataLoss(std::string("delta for ") + what + " (" + std::to_string(delta_bytes) + " bytes onto " +
                    std::to_string(size) + "): " + why + "; nothing applied");
  };
  if (delta_bytes < kHeaderBytes || head_bytes < kHeaderBytes) return bad("shorter than its 32-byte header");
  if (Load<uint32_t>(head) != kMagic) return bad("no \"WSD1\" magic");
  const uint32_t elem_bytes = head[4];
  if (!ValidElem(elem_bytes)) return bad("element size " + std::to_string(elem_bytes) + " (not 1, 2 or 4)");
  const uint64_t elements = Load<uint64_t>(head + 8);
  const uint64_t changes = Load<uint64_t>(head + 16);
  const uint64_t chunks = Load<uint32_t>(head + 24);
  if (size % elem_bytes != 0 || elements != size / elem_bytes) {
    return bad("it describes " + std::to_string(elements) + " elements of " + std::to_string(elem_bytes) +
               " bytes, the target holds " + std::to_string(size) + " bytes");
  }
  if (chunks != Chunks(elements)) return bad(std::to_string(chunks) + " chunks for " + std::to_string(elements) + " elements");
  if (HeadBytes(elements) > delta_bytes || HeadBytes(elements) > head_bytes) return bad("its chunk counts run past its end");
  std::vector<uint32_t> counts(chunks);
  for (uint64_t c = 0; c < chunks; ++c) {
    counts[c] = Load<uint32_t>(head + kHeaderBytes + 4 * c);
    const uint64_t n = ChunkLength(elements, c);
    if (counts[c] > n) {
      return bad("chunk " + std::to_string(c) + " claims " + std::to_string(counts[c]) + " changes in " +
                 std::to_string(n) + " elements");
    }
  }
  Layout l = LayoutOf(elements, elem_bytes, std::move(counts));
  if (l.changes != changes) return bad("its chunks hold " + std::to_string(l.changes) + " of " + std::to_string(changes) + " changes");
  if (l.bytes != delta_bytes) return bad("its length should be " + std::to_string(l.bytes) + " bytes");
  return l;
}

Status Apply(const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size, const char* what) {
  StatusOr<Layout> layout = ReadLayout(delta, delta_bytes, delta_bytes, size, what);
  if (!layout.ok()) return layout.status();
  const Layout& l = *layout;
  const uint32_t e = l.elem_bytes;
  // Every index and bitmap checked before the first write.
  for (uint64_t c = 0; c < l.chunks(); ++c) {
    const uint64_t n = l.chunk_length(c), k = l.counts[c];
    const uint8_t* where = delta + l.where_at[c];
    const std::string chunk = "chunk " + std::to_string(c);
    auto bad = [&](const std::string& why) {
      return DataLoss(std::string("delta for ") + what + " (" + std::to_string(delta_bytes) + " bytes onto " +
                      std::to_string(size) + "): " + chunk + " " + why + "; nothing applied");
    };
    if (l.bitmap(c)) {
      uint64_t set = 0;
      for (uint64_t byte = 0; byte < l.where_bytes(c); ++byte) {
        const uint8_t bits = where[byte];
        if (byte * 8 + 8 > n && (bits >> std::min<uint64_t>(8, n - std::min(n, byte * 8))) != 0) {
          return bad("marks elements past its " + std::to_string(n));
        }
        set += static_cast<uint64_t>(__builtin_popcount(bits));
      }
      if (set != k) return bad("has " + std::to_string(set) + " bits set for " + std::to_string(k) + " changes");
    } else {
      int64_t previous = -1;
      for (uint64_t j = 0; j < k; ++j) {
        const int64_t idx = Load<uint16_t>(where + 2 * j);
        if (idx <= previous || static_cast<uint64_t>(idx) >= n) {
          return bad("change " + std::to_string(j) + " at element " + std::to_string(idx) + " (chunk of " +
                     std::to_string(n) + ", after " + std::to_string(previous) + ")");
        }
        previous = idx;
      }
    }
  }

  const uint8_t* value = delta + l.values_at;
  for (uint64_t c = 0; c < l.chunks(); ++c) {
    const uint64_t k = l.counts[c];
    const uint8_t* where = delta + l.where_at[c];
    uint8_t* chunk = target + c * kChunkElements * e;
    auto put = [&](uint64_t i) {
      CopyElement(chunk + i * e, value, e);
      value += e;
    };
    if (l.bitmap(c)) {
      for (uint64_t w = 0; 8 * w < l.where_bytes(c); ++w) {
        uint64_t bits = 0;
        std::memcpy(&bits, where + 8 * w, std::min<uint64_t>(8, l.where_bytes(c) - 8 * w));
        for (; bits != 0; bits &= bits - 1) put(64 * w + static_cast<uint64_t>(__builtin_ctzll(bits)));
      }
    } else {
      for (uint64_t j = 0; j < k; ++j) put(Load<uint16_t>(where + 2 * j));
    }
  }
  return Status::Ok();
}

}  // namespace wsync::delta
