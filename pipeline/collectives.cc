#include "pipeline/collectives.h"

#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

namespace wsync {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string JoinKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

// The message of whatever gloo threw. Gloo throws ::gloo::Exception (and its
// IoException / InvalidOperationException) and ::gloo::EnforceNotMet, which
// is not a gloo::Exception; both are std::exceptions.
std::string CurrentExceptionMessage() {
  try {
    throw;
  } catch (const ::gloo::EnforceNotMet& e) {
    return e.msg();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Runs one gloo call; turns a throw into a Status naming the call. A throw at
// or after the deadline is DeadlineExceeded (gloo reports timeouts as
// IoException, like broken connections); IoException before it means a peer
// went away; anything else is Internal. A zero timeout means the call has no
// deadline of its own (store and setup calls).
template <typename Fn>
Status CallGloo(const std::string& what, milliseconds timeout, Fn&& fn) {
  const auto start = Clock::now();
  try {
    fn();
    return Status::Ok();
  } catch (...) {
    const std::string message = CurrentExceptionMessage();
    const bool timed_out = timeout > milliseconds::zero() && Clock::now() - start >= timeout;
    bool io_error = false;
    try {
      throw;
    } catch (const ::gloo::IoException&) {
      io_error = true;
    } catch (...) {
    }
    if (timed_out) {
      return DeadlineExceeded(what + ": no answer from a peer within " +
                              std::to_string(timeout.count()) + " ms (" + message +
                              "); check that every rank of the group is alive and makes the "
                              "same call");
    }
    if (io_error) {
      return Unavailable(what + ": lost a peer (" + message +
                         "); a rank of the group exited or its network failed");
    }
    return Internal(what + ": " + message);
  }
}

// Presents a RendezvousStore to gloo, which expects a throwing Store. The
// first error is kept so that the caller can return it with its own code
// (DeadlineExceeded from the store must not become a generic gloo error).
class GlooStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(RendezvousStore& store, milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, data));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_.Get(key, timeout_);
    Check(value.status());
    return std::move(value).value();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    Check(store_.Wait(keys, timeout));
  }

  const std::optional<Status>& first_error() const { return first_error_; }

 private:
  void Check(const Status& s) {
    if (s.ok()) return;
    if (!first_error_) first_error_ = s;
    throw ::gloo::IoException(s.message());
  }

  RendezvousStore& store_;
  milliseconds timeout_;
  std::optional<Status> first_error_;
};

class FileRendezvousStore : public RendezvousStore {
 public:
  FileRendezvousStore(std::string directory, std::unique_ptr<::gloo::rendezvous::FileStore> store)
      : directory_(std::move(directory)), store_(std::move(store)) {}

  Status Set(const std::string& key, const std::vector<char>& value) override {
    if (value.empty()) return InvalidArgument("rendezvous store: empty value for key '" + key + "'");
    std::lock_guard<std::mutex> lock(mu_);  // FileStore::set records paths unguarded
    return CallGloo("rendezvous store " + directory_ + ": set '" + key + "'", milliseconds::zero(),
                    [&] { store_->set(key, value); });
  }

  StatusOr<std::vector<char>> Get(const std::string& key, milliseconds timeout) override {
    WSYNC_RETURN_IF_ERROR(Wait({key}, timeout));
    std::vector<char> value;
    WSYNC_RETURN_IF_ERROR(CallGloo("rendezvous store " + directory_ + ": get '" + key + "'",
                                   milliseconds::zero(), [&] { value = store_->get(key); }));
    return value;
  }

  Status Wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const auto start = Clock::now();
    Status s = CallGloo("rendezvous store " + directory_, milliseconds::zero(),
                        [&] { store_->wait(keys, timeout); });
    if (!s.ok() && Clock::now() - start >= timeout) {
      return DeadlineExceeded("rendezvous store " + directory_ + ": key(s) " + JoinKeys(keys) +
                              " not set within " + std::to_string(timeout.count()) +
                              " ms; a peer has not arrived");
    }
    return s;
  }

 private:
  std::string directory_;
  std::mutex mu_;
  std::unique_ptr<::gloo::rendezvous::FileStore> store_;
};

class InMemoryRendezvousStore : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::vector<char>& value) override {
    if (value.empty()) return InvalidArgument("rendezvous store: empty value for key '" + key + "'");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!values_.emplace(key, value).second) {
        return FailedPrecondition("rendezvous store: key '" + key +
                                  "' is already set; group names must be unique per store");
      }
    }
    cv_.notify_all();
    return Status::Ok();
  }

  StatusOr<std::vector<char>> Get(const std::string& key, milliseconds timeout) override {
    WSYNC_RETURN_IF_ERROR(Wait({key}, timeout));
    std::lock_guard<std::mutex> lock(mu_);
    return values_.at(key);
  }

  Status Wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    const bool all_set = cv_.wait_for(lock, timeout, [&] {
      for (const auto& k : keys) {
        if (!values_.count(k)) return false;
      }
      return true;
    });
    if (!all_set) {
      return DeadlineExceeded("rendezvous store: key(s) " + JoinKeys(keys) + " not set within " +
                              std::to_string(timeout.count()) + " ms; a peer has not arrived");
    }
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> values_;  // guarded by mu_
};

// Gloo's tcp transport writes with writev(2), which raises SIGPIPE when a
// peer has died; the default action would kill the trainer instead of
// letting the collective fail with EPIPE. Ignore it unless the host program
// installed its own handler (Python already ignores it).
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

StatusOr<std::unique_ptr<RendezvousStore>> MakeFileRendezvousStore(const std::string& directory) {
  std::unique_ptr<::gloo::rendezvous::FileStore> store;
  Status s = CallGloo("rendezvous store " + directory, milliseconds::zero(), [&] {
    store = std::make_unique<::gloo::rendezvous::FileStore>(directory);
  });
  if (!s.ok()) {
    return InvalidArgument("rendezvous store: cannot use directory '" + directory +
                           "' (" + s.message() + "); create it on a filesystem every rank sees");
  }
  return std::unique_ptr<RendezvousStore>(
      std::make_unique<FileRendezvousStore>(directory, std::move(store)));
}

std::unique_ptr<RendezvousStore> MakeInMemoryRendezvousStore() {
  return std::make_unique<InMemoryRendezvousStore>();
}

GlooGroup::GlooGroup(std::string name, int rank, int size, milliseconds timeout,
                     std::shared_ptr<gloo::Context> context)
    : name_(std::move(name)), rank_(rank), size_(size), timeout_(timeout),
      context_(std::move(context)) {}

GlooGroup::~GlooGroup() = default;

StatusOr<std::unique_ptr<GlooGroup>> GlooGroup::Create(RendezvousStore& store,
                                                       const std::string& name, int rank, int size,
                                                       const GlooGroupOptions& options) {
  const std::string where = "group '" + name + "' rank " + std::to_string(rank) + " of " +
                            std::to_string(size);
  if (name.empty()) return InvalidArgument("gloo group: empty group name");
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("gloo " + where + ": rank must be in [0, size) and size >= 1");
  }
  if (options.timeout <= milliseconds::zero()) {
    return InvalidArgument("gloo " + where + ": timeout must be positive");
  }
  if (size == 1) {
    return std::unique_ptr<GlooGroup>(new GlooGroup(name, rank, size, options.timeout, nullptr));
  }

  IgnoreSigpipeUnlessHandled();
  ::gloo::transport::tcp::attr attr;
  if (!options.iface.empty()) {
    attr.iface = options.iface;
  } else {
    attr.hostname = options.hostname;
  }
  std::shared_ptr<::gloo::transport::Device> device;
  const std::string address = options.iface.empty() ? options.hostname : "iface " + options.iface;
  Status s = CallGloo("gloo tcp CreateDevice (" + where + ", " + address + ")",
                      milliseconds::zero(),
                      [&] { device = ::gloo::transport::tcp::CreateDevice(attr); });
  if (!s.ok()) {
    return Unavailable(s.message() + "; set GlooGroupOptions.hostname/iface to an address of "
                                     "this host that its peers can reach");
  }

  auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options.timeout);
  GlooStoreAdapter adapter(store, options.timeout);
  ::gloo::rendezvous::PrefixStore prefixed("wsync/group/" + name, adapter);
  s = CallGloo("gloo connectFullMesh (" + where + ")", options.timeout,
               [&] { context->connectFullMesh(prefixed, device); });
  if (!s.ok()) {
    // A store error (e.g. a peer never published its address) keeps its own code.
    if (adapter.first_error()) {
      return adapter.first_error()->WithContext("gloo connectFullMesh (" + where + ")");
    }
    return s;
  }
  return std::unique_ptr<GlooGroup>(
      new GlooGroup(name, rank, size, options.timeout, std::move(context)));
}

Status GlooGroup::CheckUsable(const char* call) const {
  if (broken_) {
    return FailedPrecondition("gloo " + std::string(call) + " (group '" + name_ + "' rank " +
                              std::to_string(rank_) +
                              "): an earlier collective failed; create a new group under a new name "
                              "(keys of the old one stay in the store)");
  }
  return Status::Ok();
}

Status GlooGroup::Poison(const Status& error) {
  broken_ = true;
  return error;
}

Status GlooGroup::Barrier() {
  WSYNC_RETURN_IF_ERROR(CheckUsable("barrier"));
  if (context_ == nullptr) return Status::Ok();
  const std::string what = "gloo barrier (group '" + name_ + "' rank " + std::to_string(rank_) +
                           " of " + std::to_string(size_) + ")";
  Status s = CallGloo(what, timeout_, [&] {
    ::gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout_);
    ::gloo::barrier(opts);
  });
  if (!s.ok()) return Poison(s);
  return Status::Ok();
}

Status GlooGroup::AllGatherShards(const void* shard, void* full,
                                  std::span<const int64_t> full_shape, int dim, DType dtype) {
  WSYNC_RETURN_IF_ERROR(CheckUsable("allgatherv"));
  const std::string what = "gloo allgatherv (group '" + name_ + "' rank " +
                           std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  if (dim < 0 || dim >= static_cast<int>(full_shape.size())) {
    return InvalidArgument(what + ": gather dim " + std::to_string(dim) + " is outside a " +
                           std::to_string(full_shape.size()) + "-d tensor");
  }
  int64_t outer = 1;
  int64_t inner_bytes = DTypeSize(dtype);
  for (size_t d = 0; d < full_shape.size(); ++d) {
    if (full_shape[d] < 0) return InvalidArgument(what + ": negative dim in the full shape");
    if (static_cast<int>(d) < dim) outer *= full_shape[d];
    if (static_cast<int>(d) > dim) inner_bytes *= full_shape[d];
  }
  const int64_t n = full_shape[dim];
  const int64_t total_bytes = outer * n * inner_bytes;

  // Rank-major layout of the gathered bytes: rank r's shard is [outer, len_r, inner].
  std::vector<size_t> counts(size_);
  std::vector<int64_t> offsets(size_);
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = static_cast<size_t>(outer * TorchChunk(n, size_, r).size * inner_bytes);
    offsets[r] = offset;
    offset += static_cast<int64_t>(counts[r]);
  }
  if (total_bytes == 0) return Status::Ok();
  if (full == nullptr || (shard == nullptr && counts[rank_] > 0)) {
    return InvalidArgument(what + ": null buffer for a non-empty tensor");
  }

  // With nothing before `dim`, rank-major order is the tensor's own order.
  uint8_t* gathered = static_cast<uint8_t*>(full);
  if (outer > 1) {
    staging_.resize(static_cast<size_t>(total_bytes));
    gathered = staging_.data();
  }
  // memmove: a caller may gather in place, with its shard already inside `full`.
  if (counts[rank_] > 0) std::memmove(gathered + offsets[rank_], shard, counts[rank_]);

  if (context_ != nullptr) {
    Status s = CallGloo(what, timeout_, [&] {
      ::gloo::AllgathervOptions opts(context_);
      opts.setOutput<uint8_t>(gathered, counts);
      opts.setTimeout(timeout_);
      ::gloo::allgatherv(opts);
    });
    if (!s.ok()) return Poison(s);
  }

  if (outer > 1) {
    uint8_t* out = static_cast<uint8_t*>(full);
    const int64_t row_bytes = n * inner_bytes;
    for (int r = 0; r < size_; ++r) {
      const ChunkRange chunk = TorchChunk(n, size_, r);
      const int64_t piece = chunk.size * inner_bytes;
      if (piece == 0) continue;
      for (int64_t o = 0; o < outer; ++o) {
        std::memcpy(out + o * row_bytes + chunk.begin * inner_bytes,
                    gathered + offsets[r] + o * piece, static_cast<size_t>(piece));
      }
    }
  }
  return Status::Ok();
}

Status GlooGroup::Exchange(const void* input, std::span<const int64_t> send_bytes, void* output,
                           std::span<const int64_t> recv_bytes) {
  WSYNC_RETURN_IF_ERROR(CheckUsable("alltoallv"));
  const std::string what = "gloo alltoallv (group '" + name_ + "' rank " + std::to_string(rank_) + " of " +
                           std::to_string(size_) + ")";
  if (send_bytes.size() != static_cast<size_t>(size_) || recv_bytes.size() != static_cast<size_t>(size_)) {
    return InvalidArgument(what + ": " + std::to_string(send_bytes.size()) + " send and " +
                           std::to_string(recv_bytes.size()) + " receive sizes for " + std::to_string(size_) + " ranks");
  }
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    if (send_bytes[r] < 0 || recv_bytes[r] < 0) return InvalidArgument(what + ": negative piece size");
    sent += send_bytes[r];
    received += recv_bytes[r];
  }
  if ((input == nullptr && sent > 0) || (output == nullptr && received > 0)) {
    return InvalidArgument(what + ": null buffer for a non-empty piece");
  }
  if (context_ == nullptr) {  // a group of one keeps its own piece
    if (send_bytes[0] != recv_bytes[0]) return InvalidArgument(what + ": keeps a piece of another size");
    if (sent > 0) std::memmove(output, input, static_cast<size_t>(sent));
    return Status::Ok();
  }
  // Gloo wants real buffers even for empty pieces.
  uint8_t none_in = 0, none_out = 0;
  void* in = sent > 0 ? const_cast<void*>(input) : &none_in;
  void* out = received > 0 ? output : &none_out;
  Status s = CallGloo(what, timeout_, [&] {
    ::gloo::AlltoallvOptions opts(context_);
    opts.setInput<uint8_t>(static_cast<uint8_t*>(in), std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
    opts.setOutput<uint8_t>(static_cast<uint8_t*>(out), std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
    opts.setTimeout(timeout_);
    ::gloo::alltoallv(opts);
  });
  if (!s.ok()) return Poison(s);
  return Status::Ok();
}

namespace {

class GlooGroupFactory : public GroupFactory {
 public:
  GlooGroupFactory(RendezvousStore* store, GlooGroupOptions options) : store_(store), options_(std::move(options)) {}
  StatusOr<std::unique_ptr<CollectiveGroup>> Join(const std::string& name, const std::vector<int32_t>& ranks,
                                                  int index) override {
    WSYNC_ASSIGN_OR_RETURN(std::unique_ptr<GlooGroup> group,
                           GlooGroup::Create(*store_, name, index, static_cast<int>(ranks.size()), options_));
    return std::unique_ptr<CollectiveGroup>(std::move(group));
  }

 private:
  RendezvousStore* store_;
  GlooGroupOptions options_;
};

}  // namespace

std::unique_ptr<GroupFactory> MakeGlooGroupFactory(RendezvousStore* store, GlooGroupOptions options) {
  return std::make_unique<GlooGroupFactory>(store, std::move(options));
}

}  // namespace wsync
