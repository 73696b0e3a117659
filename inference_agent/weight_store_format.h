// The on-memory format of an inference rank's weight store, shared by the
// writer (weight_store.cc, in the inference agent) and the reader
// (engine_view.h, in the engine process). Nothing here links anything.
//
// One POSIX shared-memory object, conventionally "/wsync-<job>-infer-<rank>":
//
//   [0, 4096)                 WeightStoreHeader (below)
//   [4096, 4096+layout_bytes) layout: JSON, schema wsync.weight_store/v1
//   [data_offset, ...)        the rank's regions, each 4096-aligned, in the
//                             order of InferenceRank::regions
//
// The layout travels inside the object (not in a sidecar file) so the name
// is the only thing an engine needs and the layout can never go stale:
//
//   {"schema": "wsync.weight_store/v1", "rank": 0,
//    "regions": [{"id": "weights", "offset": 8192, "size": 1048576}],
//    "tensors": [{"name": "model.embed_tokens.weight", "dtype": "bf16",
//                 "shape": [512, 256], "region": "weights",
//                 "offset": 0, "bytes": 262144}, ...]}
//
// Region "offset" is from the start of the object; tensor "offset" is from
// the start of its region (exactly the offset of the wsync.inference/v1
// spec, which is where trainers write). Scale tensors of fp8 weights are
// entries of their own, under their engine names.
//
// Version words: the agent stores `complete_version` with release semantics
// only after every write of that version has landed; an engine loads it with
// acquire semantics and may then read that version's bytes. The version
// words start at kNoVersion. `magic` is stored last (release) when the object is built,
// so a reader that sees it sees a complete header and layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace wsync::inference {

inline constexpr uint64_t kWeightStoreMagic = 0x31574E4943595357ull;  // "WSYNCIW1"
inline constexpr uint32_t kWeightStoreFormat = 1;
inline constexpr uint64_t kWeightStoreAlign = 4096;
inline constexpr uint64_t kWeightStoreHeaderBytes = 4096;
inline constexpr uint64_t kNoVersion = ~0ull;
inline constexpr const char* kWeightStoreSchema = "wsync.weight_store/v1";

struct WeightStoreHeader {
  uint64_t magic;           // kWeightStoreMagic once the object is complete
  uint32_t format;          // kWeightStoreFormat
  int32_t rank;             // inference rank
  uint64_t layout_hash;     // LayoutHash(layout JSON bytes)
  uint64_t layout_offset;   // == kWeightStoreHeaderBytes
  uint64_t layout_bytes;
  uint64_t data_offset;     // first region
  uint64_t total_bytes;     // size of the object
  uint32_t num_tensors;     // layout entries, scales included
  uint32_t num_regions;
  uint64_t reserved[8];
  // Atomic access only (__atomic_* / std::atomic_ref); own cache line so
  // engine polling does not share a line with anything the agent writes.
  alignas(64) uint64_t complete_version;  // latest version fully landed
  uint64_t completed_versions;            // how many versions completed
  uint64_t failed_version;                // highest version that failed (its
                                          // writes may have partly landed)
  uint64_t failed_versions;               // how many failed
  // Shadow mode (and host staging): the version being copied out of the
  // shadow into these weights, kNoVersion when none. While a copy runs,
  // failed_version is that version too (the bytes are a mix), so a reader
  // that ignores this word treats them as such; a reader waiting for that
  // version keeps waiting (it becomes complete, or failed with this word
  // cleared). An agent killed mid-copy leaves both words as they are.
  uint64_t committing_version;
  // Engine-paced (`wsync inference-agent --paced`): the engine's update()
  // call, through shared memory (StoreVersions.update in
  // python/wsync/_inference.py). The engine writes the version it asks for
  // (0: the newest) and how long it waits, then raises `update_request` to
  // a new sequence number; the agent answers with the version the weights
  // hold, a code (kUpdate*) and, on failure, one line, then raises
  // `update_done` to that number (release). Zero-filled when the store is
  // made: nothing asked, nothing answered.
  alignas(64) uint64_t update_request;
  uint64_t update_version;
  uint64_t update_timeout_ms;
  alignas(64) uint64_t update_done;
  uint64_t update_result;
  uint64_t update_code;
  char update_message[512];  // NUL-terminated
};
inline constexpr uint64_t kUpdateOk = 0, kUpdateFailed = 1, kUpdateTimedOut = 2;
static_assert(sizeof(WeightStoreHeader) <= kWeightStoreHeaderBytes);
static_assert(offsetof(WeightStoreHeader, update_request) == 192);
static_assert(offsetof(WeightStoreHeader, update_version) == 200);
static_assert(offsetof(WeightStoreHeader, update_timeout_ms) == 208);
static_assert(offsetof(WeightStoreHeader, update_done) == 256);
static_assert(offsetof(WeightStoreHeader, update_result) == 264);
static_assert(offsetof(WeightStoreHeader, update_code) == 272);
static_assert(offsetof(WeightStoreHeader, update_message) == 280);
// Readers in other languages find the words here (python/wsync/_inference.py).
static_assert(offsetof(WeightStoreHeader, complete_version) == 128);
static_assert(offsetof(WeightStoreHeader, failed_version) == 144);
static_assert(offsetof(WeightStoreHeader, committing_version) == 160);

inline constexpr uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// FNV-1a 64 of the layout JSON text: engines compare it with the layout
// they were configured for; the agent with the one a region it attaches to
// was built with.
inline uint64_t LayoutHash(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace wsync::inference
