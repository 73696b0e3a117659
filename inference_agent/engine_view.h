// The engine's side of the weight store: maps an inference rank's store by
// name (read-only by default), finds tensors by engine name, and reads the
// version words. Header-only and transport-free so an inference engine (or
// its C++ extension) includes this one file and links nothing of wsync but
// wsync_common; format in weight_store_format.h.
//
// How an engine uses it:
//   auto view = EngineView::Open("/wsync-job-infer-0");
//   uint64_t v = view->complete_version();      // acquire
//   if (v != kNoVersion && v != serving) {       // a new version fully landed
//     const EngineTensor* t = view->Find("model.embed_tokens.weight");
//     ... copy/bind t->data .. t->data + t->bytes ...
//   }
// The store is single-buffered: bytes of the next version land while it is
// being written, and a failed version may leave some of its writes behind.
// So treat it as a landing zone: copy (or bind) the weights when
// complete_version advances, before the next update starts (async RL
// pauses for the update), and re-check complete_version after copying. If
// failed_version is above complete_version, the bytes are a mix of the two:
// keep serving what was copied and wait for the next complete version (in
// shadow mode, committing_version equal to failed_version says that version
// is being copied in and will be complete or failed shortly).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "inference_agent/weight_store_format.h"

namespace wsync::inference {

struct EngineTensor {
  std::string name;
  std::string dtype;            // "bf16" | "fp16" | "fp32" | "fp8_e4m3"
  std::vector<int64_t> shape;   // local shape on this rank
  std::string region;
  uint64_t offset = 0;          // from the region start (the spec's offset)
  uint64_t bytes = 0;
  uint8_t* data = nullptr;      // inside the mapping
};

class EngineView {
 public:
  EngineView() = default;
  ~EngineView() { Unmap(); }
  EngineView(EngineView&& o) noexcept { *this = std::move(o); }
  EngineView& operator=(EngineView&& o) noexcept {
    if (this != &o) {
      Unmap();
      name_ = std::move(o.name_);
      base_ = std::exchange(o.base_, nullptr);
      size_ = std::exchange(o.size_, 0);
      rank_ = o.rank_;
      layout_hash_ = o.layout_hash_;
      tensors_ = std::move(o.tensors_);
      index_ = std::move(o.index_);
    }
    return *this;
  }
  EngineView(const EngineView&) = delete;
  EngineView& operator=(const EngineView&) = delete;

  // Maps `shm_name`. UNAVAILABLE while the agent has not finished building
  // it (retry); FAILED_PRECONDITION if it is not a weight store.
  static StatusOr<EngineView> Open(const std::string& shm_name, bool writable = false) {
    const int fd = shm_open(shm_name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT) {
        return Unavailable("weight store '" + shm_name + "' does not exist yet; start the inference agent first");
      }
      return Internal("shm_open('" + shm_name + "') failed: " + std::strerror(err));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      return Internal("fstat('" + shm_name + "') failed: " + std::strerror(err));
    }
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < kWeightStoreHeaderBytes) {
      close(fd);
      return Unavailable("weight store '" + shm_name + "' is not built yet (" + std::to_string(size) + " bytes)");
    }
    void* p = mmap(nullptr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED) return Internal("mmap('" + shm_name + "') failed: " + std::strerror(err));
    EngineView view;
    view.name_ = shm_name;
    view.base_ = static_cast<uint8_t*>(p);
    view.size_ = size;
    Status s = view.ReadLayout();
    if (!s.ok()) return s;
    return view;
  }

  // Latest version whose every write landed (kNoVersion before the first).
  // Acquire: the bytes of that version are visible after this load.
  uint64_t complete_version() const { return Load(&header()->complete_version); }
  uint64_t completed_versions() const { return Load(&header()->completed_versions); }
  // Latest version that could not complete (kNoVersion if none failed).
  uint64_t failed_version() const { return Load(&header()->failed_version); }
  uint64_t failed_versions() const { return Load(&header()->failed_versions); }
  // The version being copied in from the agent's shadow (kNoVersion if
  // none): failed_version equals it meanwhile, but it is not failed yet.
  uint64_t committing_version() const { return Load(&header()->committing_version); }

  const EngineTensor* Find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  const std::vector<EngineTensor>& tensors() const { return tensors_; }
  int32_t rank() const { return rank_; }
  uint64_t layout_hash() const { return layout_hash_; }
  const std::string& name() const { return name_; }

 private:
  const WeightStoreHeader* header() const { return reinterpret_cast<const WeightStoreHeader*>(base_); }
  static uint64_t Load(const uint64_t* w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }

  Status ReadLayout() {
    const std::string where = "weight store '" + name_ + "'";
    const WeightStoreHeader* h = header();
    if (Load(&h->magic) != kWeightStoreMagic) {
      return Unavailable(where + ": not built yet (no magic); retry once the inference agent is ready");
    }
    if (h->format != kWeightStoreFormat) {
      return FailedPrecondition(where + ": format " + std::to_string(h->format) + ", this reader knows " +
                                std::to_string(kWeightStoreFormat));
    }
    if (h->total_bytes > size_ || h->layout_offset + h->layout_bytes > h->data_offset ||
        h->data_offset > h->total_bytes) {
      return FailedPrecondition(where + ": header bounds exceed the object; it is corrupt");
    }
    const std::string_view text(reinterpret_cast<const char*>(base_ + h->layout_offset), h->layout_bytes);
    if (LayoutHash(text) != h->layout_hash) return FailedPrecondition(where + ": layout hash mismatch; corrupt");
    rank_ = h->rank;
    layout_hash_ = h->layout_hash;
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      if (j.at("schema").get<std::string>() != kWeightStoreSchema) {
        return FailedPrecondition(where + ": layout schema is not " + std::string(kWeightStoreSchema));
      }
      std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> regions;  // id -> offset, size
      for (const auto& r : j.at("regions")) {
        const uint64_t off = r.at("offset").get<uint64_t>(), sz = r.at("size").get<uint64_t>();
        if (off > h->total_bytes || sz > h->total_bytes - off) {
          return FailedPrecondition(where + ": region '" + r.at("id").get<std::string>() + "' exceeds the object");
        }
        regions[r.at("id").get<std::string>()] = {off, sz};
      }
      for (const auto& t : j.at("tensors")) {
        EngineTensor e;
        e.name = t.at("name").get<std::string>();
        e.dtype = t.at("dtype").get<std::string>();
        e.shape = t.at("shape").get<std::vector<int64_t>>();
        e.region = t.at("region").get<std::string>();
        e.offset = t.at("offset").get<uint64_t>();
        e.bytes = t.at("bytes").get<uint64_t>();
        auto r = regions.find(e.region);
        if (r == regions.end() || e.offset > r->second.second || e.bytes > r->second.second - e.offset) {
          return FailedPrecondition(where + ": tensor '" + e.name + "' lies outside region '" + e.region + "'");
        }
        e.data = base_ + r->second.first + e.offset;
        index_[e.name] = tensors_.size();
        tensors_.push_back(std::move(e));
      }
    } catch (const nlohmann::json::exception& ex) {
      return FailedPrecondition(where + ": malformed layout: " + ex.what());
    }
    return Status::Ok();
  }

  void Unmap() {
    if (base_ != nullptr) munmap(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }

  std::string name_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int32_t rank_ = -1;
  uint64_t layout_hash_ = 0;
  std::vector<EngineTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace wsync::inference
