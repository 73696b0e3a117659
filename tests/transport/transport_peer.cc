// transport_peer: the other process(es) of the transport tests.
//
//   transport_peer key=value...
//     dir=DIR name=NAME            files: DIR/NAME.desc (descriptor of its buffer),
//                                  DIR/NAME.bin (buffer after the expect), DIR/NAME.result
//     provider=P nics=N node=ADDR  engine options
//     bytes=B                      registered buffer size (zero-filled)
//     imm=I count=C timeout_ms=T   Expect(I, C) before dumping (count=0: no expect)
//     echo=M reply_to=FILE         receive M control messages, send each back as "echo:"+msg
//     deregister=1                 publish the descriptor, then deregister the region
//                                  (its descriptor goes stale) and wait for the expect
//     send_to=FILE seed=S          sender mode: write `bytes` seeded random bytes into
//     send_imm=I                   the region FILE describes, with immediate I
// Exit status 0 when everything it was asked to do succeeded.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <string>

#include "tests/transport/peer_files.h"
#include "transport/libfabric/libfabric_engine.h"

using namespace wsync;
using namespace wsync::transport;
using namespace wsync::transport::testing;

namespace {

int Fail(const std::string& result_path, const std::string& what) {
  std::fprintf(stderr, "transport_peer: %s\n", what.c_str());
  WriteFileAtomically(result_path, what);
  return 1;
}

}  // namespace

volatile sig_atomic_t g_terminate = 0;

int main(int argc, char** argv) {
  // SIGTERM ends the linger below so the engine is closed properly.
  struct sigaction term {};
  term.sa_handler = [](int) { g_terminate = 1; };
  sigaction(SIGTERM, &term, nullptr);
  std::map<std::string, std::string> arg;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq != nullptr) arg[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
  }
  auto get = [&](const char* k, const char* def) { return arg.count(k) ? arg[k] : std::string(def); };
  const std::string dir = get("dir", "."), name = get("name", "peer");
  const std::string result_path = dir + "/" + name + ".result";
  fabric::LibfabricOptions options;
  options.provider = get("provider", "shm");
  options.num_nics = static_cast<uint32_t>(std::stoul(get("nics", "1")));
  options.node = get("node", "");
  options.op_timeout = std::chrono::milliseconds(std::stol(get("timeout_ms", "20000")));
  auto engine_or = fabric::CreateLibfabricEngine(options);
  if (!engine_or.ok()) return Fail(result_path, engine_or.status().ToString());
  std::unique_ptr<Engine> engine = std::move(engine_or).value();

  const uint64_t bytes = std::stoull(get("bytes", "4096"));
  std::vector<uint8_t> buffer(bytes, 0);
  auto region_or = engine->Register(buffer.data(), buffer.size());
  if (!region_or.ok()) return Fail(result_path, region_or.status().ToString());
  std::unique_ptr<MemoryRegion> region = std::move(region_or).value();

  // Sender mode (used where the test process itself cannot take part, e.g.
  // inside a network namespace).
  if (arg.count("send_to")) {
    auto desc_bytes = WaitForFile(arg["send_to"], std::chrono::seconds(20));
    if (!desc_bytes) return Fail(result_path, "no descriptor at " + arg["send_to"]);
    auto desc = MemoryDescriptor::Parse(*desc_bytes);
    if (!desc.ok()) return Fail(result_path, desc.status().ToString());
    auto remote = engine->Import(*desc);
    if (!remote.ok()) return Fail(result_path, remote.status().ToString());
    std::vector<uint8_t> payload = RandomBytes(std::stoull(get("seed", "1")), bytes);
    std::memcpy(buffer.data(), payload.data(), bytes);
    std::promise<Status> done;
    SingleWrite w{region.get(), 0, *remote, 0, bytes, static_cast<uint32_t>(std::stoul(get("send_imm", "1")))};
    Status st = engine->Write(w, [&](const Status& s) { done.set_value(s); });
    if (!st.ok()) return Fail(result_path, st.ToString());
    st = done.get_future().get();
    if (!st.ok()) return Fail(result_path, st.ToString());
    WriteFileAtomically(result_path, "ok");
    return 0;
  }

  const std::string descriptor = region->descriptor().Serialize();
  // A stale descriptor: published only once its region is gone.
  if (get("deregister", "0") == "1") region.reset();
  WriteFileAtomically(dir + "/" + name + ".desc", descriptor);

  // Control messages: echo each back to the test process.
  const int echoes = std::stoi(get("echo", "0"));
  if (echoes > 0) {
    auto addr_bytes = WaitForFile(get("reply_to", ""), std::chrono::seconds(20));
    if (!addr_bytes) return Fail(result_path, "no reply address");
    auto addr = PeerAddress::Parse(*addr_bytes);
    if (!addr.ok()) return Fail(result_path, addr.status().ToString());
    auto peer = engine->AddPeer(*addr);
    if (!peer.ok()) return Fail(result_path, peer.status().ToString());
    for (int i = 0; i < echoes; ++i) {
      std::promise<StatusOr<std::string>> got;
      Status st = engine->Recv([&](StatusOr<std::string> m) { got.set_value(std::move(m)); });
      if (!st.ok()) return Fail(result_path, st.ToString());
      StatusOr<std::string> m = got.get_future().get();
      if (!m.ok()) return Fail(result_path, m.status().ToString());
      std::promise<Status> sent;
      st = engine->Send(*peer, "echo:" + *m, [&](const Status& s) { sent.set_value(s); });
      if (!st.ok()) return Fail(result_path, st.ToString());
      st = sent.get_future().get();
      if (!st.ok()) return Fail(result_path, st.ToString());
    }
  }

  const uint32_t count = static_cast<uint32_t>(std::stoul(get("count", "0")));
  if (count > 0) {
    std::promise<Status> fired;
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::stol(get("timeout_ms", "20000")));
    Status st = engine->Expect(static_cast<uint32_t>(std::stoul(get("imm", "1"))), count,
                               [&](const Status& s) { fired.set_value(s); }, deadline);
    if (!st.ok()) return Fail(result_path, st.ToString());
    st = fired.get_future().get();
    if (!st.ok()) return Fail(result_path, st.ToString());
  }
  WriteFileAtomically(dir + "/" + name + ".bin", std::string(buffer.begin(), buffer.end()));
  WriteFileAtomically(result_path, "ok");
  // Stay reachable until the test has read the result (it kills us), so a
  // sender's late completions never meet a closed endpoint.
  if (get("linger", "0") == "1") {
    while (!g_terminate) pause();
  }
  return 0;  // destructors close the endpoints (and remove shm regions)
}
