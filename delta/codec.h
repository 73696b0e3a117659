// Delta encoding of one written region (issue #30): what changed between
// the bytes a receiver holds (the base) and a new version's bytes, as
// (index, value) pairs of elements of 1, 2 or 4 bytes (fp8 codes, bf16,
// fp32 scales), so a version can send about 1-7% of its bytes at RL
// learning rates instead of all of them (docs/DELTAS.md has the
// measurements behind the format).
//
// Format "wsync delta v1", little-endian, self-describing and checked whole
// before a byte of the target changes:
//
//   header  32 bytes: u32 magic "WSD1" | u8 elem_bytes | u8[3] 0 |
//                     u64 elements | u64 changes | u32 chunks | u32 0
//   counts  u32[chunks]   changes in each chunk of kChunkElements elements
//   where   per chunk, whichever is smaller, told apart by its count alone:
//             u16 index[count]  each change's element within the chunk,
//                               strictly ascending, or
//             u16 bitmap[ceil(n / 16)]  bit i of word i / 16 set where
//                               element i changed (n: the chunk's elements)
//   values  elem[changes] at the next multiple of elem_bytes, in element order
//
// Chunks keep indices at 16 bits and let every chunk decode on its own (a
// GPU block per chunk once counts are prefix-summed). Indices cost 2 bytes
// a change, the bitmap 1/8 byte an element: measured on a Qwen3-shaped
// model (docs/DELTAS.md), bf16 changes 3.4% of its elements per AdamW step
// at lr 1e-6 (indices win: 6.8% of the bytes) and 20% at lr 1e-5 (the
// bitmap wins: 26%, where indices alone would send 40%).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace wsync::delta {

constexpr uint64_t kChunkElements = uint64_t{1} << 16;
constexpr uint64_t kHeaderBytes = 32;

struct Encoded {
  bool fits = false;     // false: the delta would pass `capacity`; nothing in `out` is meaningful
  uint64_t bytes = 0;    // written to out, when it fits
  uint64_t changes = 0;  // changed elements (counted in full either way)
};

// Compares `next` against `base` (both `size` bytes, a multiple of
// elem_bytes in {1, 2, 4}) and writes their delta to out[0, capacity).
// Either way `base` ends equal to `next` (changed elements are copied in as
// they are found, so the caller's copy of what receivers hold advances in
// the same pass; it must be dropped if this version does not land).
// Fails only on arguments no caller should pass.
StatusOr<Encoded> EncodeAndAdvance(uint8_t* base, const uint8_t* next, uint64_t size, uint32_t elem_bytes,
                                   uint8_t* out, uint64_t capacity);

// Applies a delta written by EncodeAndAdvance to `target` (`size` bytes).
// Every field is checked against `size` and `delta_bytes` before any byte
// of target changes: a delta that does not describe this target changes
// nothing and the error says which field is wrong and where (`what` names
// the region in it).
Status Apply(const uint8_t* delta, uint64_t delta_bytes, uint8_t* target, uint64_t size, const char* what);

// Where each chunk's parts lie in a delta: what a decoder (the CPU's or a
// kernel's) needs besides the bytes themselves.
struct Layout {
  uint32_t elem_bytes = 1;
  uint64_t elements = 0;
  uint64_t changes = 0;
  std::vector<uint32_t> counts;       // per chunk
  std::vector<uint64_t> where_at;     // per chunk: bytes from the delta's start
  std::vector<uint64_t> first_value;  // per chunk: index of its first value
  uint64_t values_at = 0;             // bytes from the delta's start
  uint64_t bytes = 0;                 // the whole delta

  uint64_t chunks() const { return counts.size(); }
  uint64_t chunk_length(uint64_t c) const;
  bool bitmap(uint64_t c) const;      // chunk c says where with a bitmap
  uint64_t where_bytes(uint64_t c) const;
};

// The layout of a delta with these per-chunk counts (an encoder's view).
Layout LayoutOf(uint64_t elements, uint32_t elem_bytes, std::vector<uint32_t> counts);
// Writes the header and the counts (the first HeadBytes of the delta).
void WriteHead(const Layout& layout, uint8_t* out);
// Bytes of the header and counts of a delta of `elements` elements.
uint64_t HeadBytes(uint64_t elements);
// The header's element count, 0 if `header` (kHeaderBytes) is no delta's.
uint64_t ElementsOf(const uint8_t* header);
// Reads a delta's header and counts (`head`: its first HeadBytes bytes) and
// checks them against its length and its target's size (a decoder's view);
// the errors are Apply's.
StatusOr<Layout> ReadLayout(const uint8_t* head, uint64_t head_bytes, uint64_t delta_bytes, uint64_t size,
                            const char* what);

}  // namespace wsync::delta
