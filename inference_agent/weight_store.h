// The host memory that holds one inference rank's weights: a shared-memory
// object an engine process maps by name (format in weight_store_format.h),
// laid out exactly as the rank's wsync.inference/v1 entry says, so trainers
// write each tensor's bytes at the spec's region + offset.
//
// Created by the InferenceAgent (or by the engine, which then starts the
// agent with --attach); the agent registers regions() with the transport and
// is the only writer of the version words. Engines read through EngineView
// (engine_view.h). Target wsync_weight_store: no transport dependency.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/shm_region.h"
#include "common/status.h"
#include "inference_agent/weight_store_format.h"
#include "routing/metadata.h"

namespace wsync::inference {

// "/wsync-<job>-infer-<rank>".
std::string WeightStoreName(const std::string& job, int32_t rank);

class WeightStore {
 public:
  struct Region {
    std::string id;
    uint8_t* data = nullptr;
    uint64_t size = 0;
  };

  // Creates `shm_name` (replacing an object of that name) sized for `rank`'s
  // regions, zero-filled, both version words kNoVersion. The name is removed
  // when the store is destroyed unless KeepName() was called.
  static StatusOr<WeightStore> Create(const std::string& shm_name, const InferenceRank& rank);
  // Maps an existing store (an agent restarted while the engine kept the
  // weights): its layout must be the one `rank` gives, byte for byte; the
  // weights and version words are kept as they are.
  static StatusOr<WeightStore> Attach(const std::string& shm_name, const InferenceRank& rank);

  // The layout JSON (wsync.weight_store/v1) `rank` gives, and the object
  // size it needs. Fails with one line naming the rank and tensor if a
  // tensor lies outside its region or names an unknown one.
  struct Layout {
    std::string json;
    std::vector<uint64_t> region_offsets;  // per InferenceRank::regions
    uint64_t data_offset = 0;
    uint64_t total_bytes = 0;
    uint32_t num_tensors = 0;
  };
  static StatusOr<Layout> BuildLayout(const InferenceRank& rank);

  const std::string& name() const { return shm_.name(); }
  const std::vector<Region>& regions() const { return regions_; }
  uint64_t layout_hash() const { return header()->layout_hash; }

  // Acquire loads.
  uint64_t complete_version() const;
  uint64_t failed_version() const;
  uint64_t committing_version() const;

  // Release stores. Call MarkComplete(v) only once every write of v has
  // landed. Neither word moves backwards: an older v than the current one
  // only bumps the count (MarkComplete returns false). MarkCommitting(v):
  // v is being copied in from a shadow (weight_store_format.h); it ends with
  // MarkComplete(v), or MarkFailed(v), which also clears it.
  bool MarkComplete(uint64_t v);
  void MarkFailed(uint64_t v);
  void MarkCommitting(uint64_t v);

  void KeepName() { shm_.KeepName(); }

  // Engine-paced (--paced): the engine's update() requests through the
  // header's update words (weight_store_format.h). Valid while the mapping
  // lives (the store may move meanwhile: the mapping does not).
  class UpdateChannel {
   public:
    struct Request {
      uint64_t seq = 0;
      uint64_t version = 0;     // 0: the newest
      uint64_t timeout_ms = 0;
    };
    // A request newer than the last one answered, if any (acquire).
    std::optional<Request> Pending() const;
    // Answers request `seq` (release, after the result and message).
    void Answer(uint64_t seq, uint64_t version, uint64_t code, const std::string& message);

   private:
    friend class WeightStore;
    explicit UpdateChannel(WeightStoreHeader* h) : h_(h) {}
    WeightStoreHeader* h_;
  };
  UpdateChannel update_channel() const { return UpdateChannel(header()); }

 private:
  WeightStoreHeader* header() const { return reinterpret_cast<WeightStoreHeader*>(shm_.data()); }
  void MapRegions(const InferenceRank& rank, const Layout& layout);
  void RaiseFailed(uint64_t v);  // failed_version up to v, no count

  ShmRegion shm_;
  std::vector<Region> regions_;
};

}  // namespace wsync::inference
