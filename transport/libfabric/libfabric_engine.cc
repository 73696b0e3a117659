#include "transport/libfabric/libfabric_engine.h"

#include <rdma/fabric.h>

#include <cstdlib>

#include "transport/libfabric/callback_thread.h"
#include "transport/libfabric/domain_group.h"
#include "transport/libfabric/fabric_info.h"
#include "transport/libfabric/foreign_signals.h"
#include "transport/libfabric/memory_region.h"

namespace wsync::transport::fabric {

class LibfabricEngine final : public Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const LibfabricOptions& options) {
    ReleaseSignalsFromInfinipath();
    std::unique_ptr<LibfabricEngine> engine(new LibfabricEngine);
    WSYNC_ASSIGN_OR_RETURN(engine->group_, DomainGroup::Start(options, &engine->callbacks_));
    const uint32_t v = fi_version();
    engine->caps_.library = "libfabric " + std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
    // libfabric 1.x's shm takes a spin lock in the target's shared region
    // for every RMA; a writer killed while holding it stalls every other
    // writer to that target inside fi_writedata (seen once in 200 chaos
    // faults; none on 2.7: docs/CONTROL_PLANE.md).
    if (engine->group_->provider() == "shm" && FI_MAJOR(v) < 2) {
      engine->caps_.caveat =
          "shm before libfabric 2: a writer killed inside a write can stall every writer to that target "
          "(docs/CONTROL_PLANE.md)";
    }
    if (options.enable_hmem) engine->ProbeCuda();
    return std::unique_ptr<Engine>(std::move(engine));
  }

  // The group (worker) stops first and hands its aborted requests to the
  // callback thread, which runs them and then stops (members in reverse).
  ~LibfabricEngine() override { group_.reset(); }

  const std::string& provider() const override { return group_->provider(); }
  uint32_t num_nics() const override { return group_->num_nics(); }
  const PeerAddress& local_address() const override { return group_->address(); }
  const Capabilities& capabilities() const override { return caps_; }
  std::string Describe() const override {
    return caps_.library + " " + group_->provider() + ", " + std::to_string(num_nics()) + " NIC(s), worker " +
           group_->pinned_where() + ", CUDA memory " +
           (caps_.cuda_memory ? "yes" : caps_.cuda_memory_note.empty() ? "no" : "no: " + caps_.cuda_memory_note) +
           (caps_.caveat.empty() ? "" : "; caveat: " + caps_.caveat);
  }
  uint32_t ArrivalsPerWrite(uint64_t length) const override { return group_->ArrivalsPerWrite(length); }
  uint32_t ArrivalsPerPagedWrite(uint32_t pages) const override { return group_->ArrivalsPerPagedWrite(pages); }

  StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, uint64_t length, MemoryKind kind,
                                                   int device) override {
    if (data == nullptr || length == 0) return InvalidArgument("register: null pointer or zero length");
    auto region = std::make_unique<LibfabricMemoryRegion>(group_.get(), data, length, kind);
    region->device_ = device;
    WSYNC_RETURN_IF_ERROR(group_->RunOnWorker([&] { return region->RegisterOnWorker(); }));
    return std::unique_ptr<MemoryRegion>(std::move(region));
  }

  StatusOr<PeerId> AddPeer(const PeerAddress& address) override {
    PeerId id = 0;
    WSYNC_RETURN_IF_ERROR(group_->RunOnWorker([&]() -> Status {
      WSYNC_ASSIGN_OR_RETURN(id, group_->AddPeerOnWorker(address));
      return Status::Ok();
    }));
    return id;
  }

  StatusOr<RemoteMemory> Import(const MemoryDescriptor& descriptor) override {
    if (descriptor.nics.size() != num_nics())
      return InvalidArgument("import: descriptor names " + std::to_string(descriptor.nics.size()) +
                             " NICs, this engine has " + std::to_string(num_nics()) +
                             "; all peers must use the same NIC count");
    PeerAddress address;
    for (const NicKey& nic : descriptor.nics) address.nics.push_back(nic.nic_address);
    WSYNC_ASSIGN_OR_RETURN(PeerId peer, AddPeer(address));
    RemoteMemory remote;
    remote.peer = peer;
    remote.address = descriptor.address;
    remote.length = descriptor.length;
    remote.num_nics = num_nics();
    for (uint32_t i = 0; i < num_nics(); ++i) remote.keys[i] = descriptor.nics[i].key;
    return remote;
  }

  Status Write(SingleWrite w, Callback done) override {
    WSYNC_RETURN_IF_ERROR(CheckSource(w.src, w.src_offset, w.length, "write"));
    WSYNC_RETURN_IF_ERROR(CheckTarget(w.dst, w.dst_offset, w.length, "write"));
    auto* r = NewRequest(RequestKind::kWrite, std::move(done));
    r->write = std::move(w);
    group_->Submit(r);
    return Status::Ok();
  }

  Status WritePaged(PagedWrite p, Callback done) override {
    if (p.src_pages.indices.size() != p.dst_pages.indices.size())
      return InvalidArgument("paged write: " + std::to_string(p.src_pages.indices.size()) + " source pages but " +
                             std::to_string(p.dst_pages.indices.size()) + " destination pages");
    if (p.page_length == 0 && !p.src_pages.indices.empty())
      return InvalidArgument("paged write: page_length is 0");
    for (size_t i = 0; i < p.src_pages.indices.size(); ++i) {
      const uint64_t s = p.src_pages.offset + uint64_t{p.src_pages.indices[i]} * p.src_pages.stride;
      const uint64_t d = p.dst_pages.offset + uint64_t{p.dst_pages.indices[i]} * p.dst_pages.stride;
      const std::string what = "paged write, page " + std::to_string(i);
      WSYNC_RETURN_IF_ERROR(CheckSource(p.src, s, p.page_length, what));
      WSYNC_RETURN_IF_ERROR(CheckTarget(p.dst, d, p.page_length, what));
    }
    auto* r = NewRequest(RequestKind::kPaged, std::move(done));
    r->paged = std::move(p);
    group_->Submit(r);
    return Status::Ok();
  }

  Status Scatter(ScatterWrite s, Callback done) override {
    for (size_t i = 0; i < s.slices.size(); ++i) {
      const ScatterSlice& slice = s.slices[i];
      const std::string what = "scatter, slice " + std::to_string(i);
      WSYNC_RETURN_IF_ERROR(CheckSource(s.src, slice.src_offset, slice.length, what));
      WSYNC_RETURN_IF_ERROR(CheckTarget(slice.dst, slice.dst_offset, slice.length, what));
    }
    auto* r = NewRequest(RequestKind::kScatter, std::move(done));
    r->scatter = std::move(s);
    group_->Submit(r);
    return Status::Ok();
  }

  Status Barrier(BarrierWrite b, Callback done) override {
    for (size_t i = 0; i < b.peers.size(); ++i)
      WSYNC_RETURN_IF_ERROR(CheckTarget(b.peers[i], 0, 0, "barrier, peer " + std::to_string(i)));
    auto* r = NewRequest(RequestKind::kBarrier, std::move(done));
    r->barrier = std::move(b);
    group_->Submit(r);
    return Status::Ok();
  }

  Status Send(PeerId peer, std::string message, Callback done) override {
    if (peer >= group_->num_peers())
      return NotFound("send: unknown peer " + std::to_string(peer) + "; add it with AddPeer first");
    if (message.size() > kMaxControlMessage)
      return InvalidArgument("send: " + std::to_string(message.size()) + "-byte message exceeds the " +
                             std::to_string(kMaxControlMessage) + "-byte control limit; write bulk data with Write");
    auto* r = NewRequest(RequestKind::kSend, std::move(done));
    r->peer = peer;
    r->message = std::move(message);
    group_->Submit(r);
    return Status::Ok();
  }

  Status Recv(RecvCallback done, Clock::time_point deadline) override {
    auto* r = new Request;
    r->kind = RequestKind::kRecv;
    r->recv_done = std::move(done);
    r->expect_deadline = deadline;
    group_->Submit(r);
    return Status::Ok();
  }

  Status Expect(uint32_t imm, uint32_t count, Callback done, Clock::time_point deadline) override {
    auto* r = NewRequest(RequestKind::kExpect, std::move(done));
    r->imm = imm;
    r->count = count;
    r->expect_deadline = deadline;
    group_->Submit(r);
    return Status::Ok();
  }

 private:
  // The CUDA interface of the loaded libfabric came up iff registering with
  // FI_HMEM_CUDA is not refused as unimplemented (-FI_ENOSYS: built without
  // CUDA, or no driver). The probe buffer is host memory, so a CUDA-capable
  // build may refuse it otherwise (or take it): either way it can register
  // device memory.
  //
  // shm moves device memory by a copy in the target process. Before
  // libfabric gained hmem_cuda_enable_async_copy (its main branch, mid 2026)
  // that copy was a cudaMemcpy, which returns before a device-to-device copy
  // has run: both sides' completions, the immediate included, then come
  // before the bytes land (ofiwg/libfabric#11231), so the writer reuses its
  // buffer under a copy still to run and the target reads stale bytes (seen
  // on an H200: a tensor of the last source wrong). Such an shm is refused
  // for CUDA memory, never used half right.
  void ProbeCuda() {
    void* probe = std::aligned_alloc(4096, 4096);
    if (probe == nullptr) return;
    auto region = std::make_unique<LibfabricMemoryRegion>(group_.get(), probe, 4096, MemoryKind::kCuda);
    region->device_ = 0;
    Status s = group_->RunOnWorker([&] { return region->RegisterOnWorker(); });
    region.reset();
    std::free(probe);
    if (!s.ok() && s.message().find("without CUDA support") != std::string::npos) {
      caps_.cuda_memory_note = "built without CUDA support, or no CUDA driver";
      return;
    }
    if (group_->provider() == "shm" && !ShmCopiesCudaAsynchronously()) {
      caps_.cuda_memory_note =
          "this libfabric's shm reports CUDA writes complete before their copy has run (ofiwg/libfabric#11231); "
          "it needs the asynchronous CUDA IPC copy (parameter hmem_cuda_enable_async_copy, libfabric main since "
          "2026-06) left on";
      return;
    }
    caps_.cuda_memory = true;
  }

  // The library defines hmem_cuda_enable_async_copy and it is not turned off.
  static bool ShmCopiesCudaAsynchronously() {
    return LibfabricDefinesParam("FI_HMEM_CUDA_ENABLE_ASYNC_COPY") && !EnvBoolOff("FI_HMEM_CUDA_ENABLE_ASYNC_COPY");
  }

  LibfabricEngine() = default;

  static Request* NewRequest(RequestKind kind, Callback done) {
    auto* r = new Request;
    r->kind = kind;
    r->done = std::move(done);
    return r;
  }

  Status CheckSource(const MemoryRegion* src, uint64_t offset, uint64_t length, const std::string& what) const {
    if (length == 0) return Status::Ok();
    if (src == nullptr) return InvalidArgument(what + ": no source region");
    auto* region = dynamic_cast<const LibfabricMemoryRegion*>(src);
    if (region == nullptr || region->group() != group_.get())
      return InvalidArgument(what + ": source region was registered with another engine");
    if (offset > src->length() || length > src->length() - offset)
      return OutOfRange(what + ": source bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                        ") leave the " + std::to_string(src->length()) + "-byte local region");
    return Status::Ok();
  }

  Status CheckTarget(const RemoteMemory& dst, uint64_t offset, uint64_t length, const std::string& what) const {
    if (dst.peer >= group_->num_peers())
      return NotFound(what + ": unknown peer " + std::to_string(dst.peer) + "; resolve its descriptor with Import");
    if (dst.num_nics != num_nics())
      return InvalidArgument(what + ": remote region has " + std::to_string(dst.num_nics) + " NIC keys, engine " +
                             std::to_string(num_nics()) + " NICs; resolve the descriptor with Import");
    if (offset > dst.length || length > dst.length - offset)
      return OutOfRange(what + ": remote bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                        ") leave the " + std::to_string(dst.length) + "-byte remote region of peer " +
                        std::to_string(dst.peer));
    return Status::Ok();
  }

  // Members in creation order: callbacks outlive the group that feeds them.
  CallbackThread callbacks_;
  Capabilities caps_;
  std::unique_ptr<DomainGroup> group_;
};

StatusOr<std::unique_ptr<Engine>> CreateLibfabricEngine(const LibfabricOptions& options) {
  return LibfabricEngine::Create(options);
}

StatusOr<GpuMemory> GpuMemoryForStaging(const std::string& staging) {
  if (staging == "auto") return GpuMemory::kDirectOrHost;
  if (staging == "on") return GpuMemory::kHost;
  if (staging == "off") return GpuMemory::kDirect;
  return InvalidArgument("staging='" + staging + "': expected 'auto', 'on' or 'off'");
}

StatusOr<GpuEngine> CreateLibfabricEngineForGpu(LibfabricOptions options, GpuMemory want) {
  GpuEngine out;
  out.why_not = "host staging asked for";
  if (want != GpuMemory::kHost) {
    options.enable_hmem = true;
    StatusOr<std::unique_ptr<Engine>> hmem = CreateLibfabricEngine(options);
    if (hmem.ok() && (*hmem)->capabilities().cuda_memory) {
      out.engine = std::move(hmem).value();
      out.cuda_memory = true;
      out.why_not.clear();
      return out;
    }
    out.why_not = hmem.ok() ? (*hmem)->Describe() : hmem.status().message();
    if (want == GpuMemory::kDirect) {
      return FailedPrecondition("the transport cannot register GPU memory (" + out.why_not +
                                "); use a libfabric built with CUDA (FI_HMEM), or host staging");
    }
  }  // an engine that cannot take CUDA memory stops before the host one starts
  options.enable_hmem = false;
  WSYNC_ASSIGN_OR_RETURN(out.engine, CreateLibfabricEngine(options));
  return out;
}

}  // namespace wsync::transport::fabric
