// Where delta versions land on an inference rank (issue #30, docs/DELTAS.md).
//
// An inference rank that takes deltas registers, beside each weight region
// X it can apply deltas to, one more region "X#delta", its inbox, of
// InboxBytes(size of X). A write of bytes [o, o + b) of X owns the slot
// [SlotBegin(o), SlotBegin(o + b)) of X's inbox: about b / kInboxDivisor
// bytes, 8-byte aligned. SlotBegin is monotone, so the slots of writes that
// do not overlap do not overlap either, and the trainer that posts a write
// and the rank that receives it find its slot from the write alone: the plan
// needs no slot table.
//
// A trainer whose delta for a write fits the slot writes it there, behind a
// SlotHeader, instead of the write's bytes in place; the same one write,
// with the same immediate, so a version's arrival count does not change.
// At commit the receiver applies every slot stamped with the version.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace wsync::delta {

// Inbox bytes per weight byte: 1/3. bf16 at RL learning rates sends 7-25%
// of its bytes as a delta and fp8 1-9% (docs/DELTAS.md): the slots hold all
// of them, and a write whose delta would not fit (over ~1/3 of it, less than
// a 3x saving) goes whole, in place.
constexpr uint64_t kInboxDivisor = 3;
constexpr uint64_t kSlotAlign = 8;

constexpr std::string_view kInboxSuffix = "#delta";

inline std::string InboxRegionId(std::string_view region) {
  return std::string(region) + std::string(kInboxSuffix);
}
// True for an inbox's id; `of` (if given) gets the weight region it serves.
inline bool IsInboxRegionId(std::string_view id, std::string* of = nullptr) {
  if (id.size() <= kInboxSuffix.size() || id.substr(id.size() - kInboxSuffix.size()) != kInboxSuffix) return false;
  if (of != nullptr) *of = std::string(id.substr(0, id.size() - kInboxSuffix.size()));
  return true;
}

// The slot boundary for weight byte offset o: ceil(o / (divisor * align)) * align.
constexpr uint64_t SlotBegin(uint64_t o) {
  return (o / (kInboxDivisor * kSlotAlign) + (o % (kInboxDivisor * kSlotAlign) != 0 ? 1 : 0)) * kSlotAlign;
}
constexpr uint64_t InboxBytes(uint64_t region_bytes) { return SlotBegin(region_bytes); }

struct Slot {
  uint64_t at = 0;     // bytes from the inbox's start
  uint64_t bytes = 0;  // its capacity, header included
};
constexpr Slot SlotOf(uint64_t offset, uint64_t bytes) {
  return {SlotBegin(offset), SlotBegin(offset + bytes) - SlotBegin(offset)};
}

// What precedes a delta in its slot: which version it brings, which version
// it was computed against, and its length. 32 bytes, little-endian.
struct SlotHeader {
  uint64_t version = 0;
  uint64_t base = 0;
  uint64_t delta_bytes = 0;  // the codec's bytes after this header
};
constexpr uint64_t kSlotMagic = 0x544c4544434e5953ull;  // "SYNCDELT" read as a little-endian u64
constexpr uint64_t kSlotHeaderBytes = 32;

inline void WriteSlotHeader(const SlotHeader& h, uint8_t* out) {
  const uint64_t words[4] = {kSlotMagic, h.version, h.base, h.delta_bytes};
  std::memcpy(out, words, sizeof words);
}
// False unless `in` starts with a slot header (the magic).
inline bool ReadSlotHeader(const uint8_t* in, SlotHeader* h) {
  uint64_t words[4];
  std::memcpy(words, in, sizeof words);
  if (words[0] != kSlotMagic) return false;
  *h = {words[1], words[2], words[3]};
  return true;
}

}  // namespace wsync::delta
