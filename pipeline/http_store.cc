#include "pipeline/http_store.h"

#include <algorithm>

namespace wsync {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class HttpRendezvousStore : public RendezvousStore {
 public:
  explicit HttpRendezvousStore(controller::ControllerClient client) : client_(std::move(client)) {}

  Status Set(const std::string& key, const std::vector<char>& value) override {
    if (value.empty()) return InvalidArgument("rendezvous store: empty value for key '" + key + "'");
    Status s = client_.KvSet(key, std::string(value.begin(), value.end()));
    return s.ok() ? s : s.WithContext("rendezvous store at controller " + client_.address() + ": set '" + key + "'");
  }

  StatusOr<std::vector<char>> Get(const std::string& key, milliseconds timeout) override {
    StatusOr<std::string> v = client_.KvGet(key, timeout);
    if (!v.ok()) return Translate(v.status(), key, timeout);
    return std::vector<char>(v->begin(), v->end());
  }

  Status Wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const Clock::time_point deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      const auto left = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      StatusOr<std::string> v = client_.KvGet(key, left);
      if (!v.ok()) return Translate(v.status(), key, timeout);
    }
    return Status::Ok();
  }

 private:
  // A key still missing when the wait ends means a peer has not arrived.
  Status Translate(const Status& s, const std::string& key, milliseconds timeout) const {
    if (s.code() == StatusCode::kNotFound) {
      return DeadlineExceeded("rendezvous store at controller " + client_.address() + ": key '" + key +
                              "' not set within " + std::to_string(timeout.count()) + " ms; a peer has not arrived");
    }
    return s.WithContext("rendezvous store at controller " + client_.address() + ": get '" + key + "'");
  }

  controller::ControllerClient client_;
};

}  // namespace

std::unique_ptr<RendezvousStore> MakeHttpRendezvousStore(controller::ControllerClient client) {
  return std::make_unique<HttpRendezvousStore>(std::move(client));
}

}  // namespace wsync
