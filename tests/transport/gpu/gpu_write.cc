// transport_gpu_write: GPU 0 memory in one process written into GPU 1
// memory in another through the engine (shm, FI_HMEM=cuda), verified byte
// for byte, with its bandwidth. Needs two GPUs and a libfabric built with
// CUDA; not part of ctest (the CI machine has no GPU).
//
// CUDA is reached through the driver API loaded at run time (dlopen), so
// this builds on machines without the CUDA toolkit and runs where a driver
// is present.
//
//   transport_gpu_write [bytes=268435456] [iters=20] [provider=shm] [dst_gpu=1]
//                       [ctx_on_worker=1] [op_timeout_s=60]
//
// dst_gpu=0 writes between two processes on one GPU (the one-GPU machine).
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "tests/transport/peer_files.h"
#include "transport/libfabric/libfabric_engine.h"

using namespace wsync;
using namespace wsync::transport;

namespace {

bool ctx_on_worker = true;
int op_timeout_s = 60;  // op_timeout_s=N: how long a write may stay incomplete

// The few driver entry points we need, resolved from libcuda.so.1.
struct Cuda {
  using CUresult = int;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGet)(int*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(void**, int) = nullptr;
  CUresult (*cuCtxSetCurrent)(void*) = nullptr;
  CUresult (*cuMemAlloc)(uint64_t*, size_t) = nullptr;
  CUresult (*cuMemcpyHtoD)(uint64_t, const void*, size_t) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, uint64_t, size_t) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char*, int, int) = nullptr;

  std::string Load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) return std::string("dlopen libcuda.so.1: ") + dlerror();
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    if (!sym(cuInit, "cuInit") || !sym(cuDeviceGet, "cuDeviceGet") ||
        !sym(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") || !sym(cuCtxSetCurrent, "cuCtxSetCurrent") ||
        !sym(cuMemAlloc, "cuMemAlloc_v2") || !sym(cuMemcpyHtoD, "cuMemcpyHtoD_v2") ||
        !sym(cuMemcpyDtoH, "cuMemcpyDtoH_v2") || !sym(cuGetErrorString, "cuGetErrorString") ||
        !sym(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"))
      return "libcuda.so.1 lacks a needed driver entry point";
    return "";
  }
  std::string Check(CUresult r, const char* what) {
    if (r == 0) return "";
    const char* s = "?";
    cuGetErrorString(r, &s);
    return std::string(what) + ": " + s;
  }
  // Makes `device` current on this thread; returns a device allocation.
  std::string Alloc(int device, size_t bytes, uint64_t* ptr) {
    int dev = 0;
    void* ctx = nullptr;
    std::string e = Check(cuInit(0), "cuInit");
    if (e.empty()) e = Check(cuDeviceGet(&dev, device), "cuDeviceGet");
    if (e.empty()) e = Check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    if (e.empty()) e = Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    context = ctx;
    if (e.empty()) e = Check(cuMemAlloc(ptr, bytes), "cuMemAlloc");
    char bus[32] = {};
    if (e.empty() && cuDeviceGetPCIBusId(bus, sizeof(bus), dev) == 0) pci_bus_id = bus;
    return e;
  }
  std::string pci_bus_id;
  void* context = nullptr;  // the primary context Alloc made current
};

void Send(int fd, const std::string& s) {
  uint64_t n = s.size();
  if (write(fd, &n, 8) != 8 || write(fd, s.data(), n) != static_cast<ssize_t>(n)) std::perror("pipe write");
}
std::string Receive(int fd) {
  uint64_t n = 0;
  if (read(fd, &n, 8) != 8) return "";
  std::string s(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, s.data() + got, n - got);
    if (r <= 0) return "";
    got += r;
  }
  return s;
}

fabric::LibfabricOptions Options(const std::string& provider, int gpu, const std::string& bus_id, Cuda* cuda) {
  fabric::LibfabricOptions o;
  // The worker progresses the endpoint, so libfabric's CUDA calls run there:
  // give it the context this process allocated in (ctx_on_worker=0: don't).
  if (cuda != nullptr && cuda->context != nullptr) {
    o.on_worker_start = [cuda] { cuda->cuCtxSetCurrent(cuda->context); };
  }
  o.provider = provider;
  o.enable_hmem = true;
  o.gpu = gpu;  // pin near the GPU (hwloc), as a DomainGroup should
  o.gpu_pci_bus_id = bus_id;
  o.idle_after = std::chrono::microseconds(0);
  o.op_timeout = std::chrono::seconds(op_timeout_s);
  return o;
}

// Child: GPU `gpu` (1 by default), the target. Messages to the parent:
// "D"+descriptor, then "OK" or "E"+error.
int Receiver(const std::string& provider, size_t bytes, int iters, int gpu, int to_parent, int from_parent) {
  Cuda cuda;
  std::string e = cuda.Load();
  uint64_t dptr = 0;
  if (e.empty()) e = cuda.Alloc(gpu, bytes, &dptr);
  if (!e.empty()) return Send(to_parent, "E" + e), 1;
  auto engine = fabric::CreateLibfabricEngine(Options(provider, gpu, cuda.pci_bus_id, ctx_on_worker ? &cuda : nullptr));
  if (!engine.ok()) return Send(to_parent, "E" + engine.status().ToString()), 1;
  auto region = (*engine)->Register(reinterpret_cast<void*>(dptr), bytes, MemoryKind::kCuda, gpu);
  if (!region.ok()) return Send(to_parent, "Eregister GPU 1 memory: " + region.status().ToString()), 1;
  std::promise<Status> fired;
  const uint32_t count = (iters + 1) * (*engine)->ArrivalsPerWrite(bytes);  // + warm-up
  Status st = (*engine)->Expect(77, count, [&](const Status& s) { fired.set_value(s); },
                                Clock::now() + std::chrono::seconds(2 * op_timeout_s));
  Send(to_parent, "D" + (*region)->descriptor().Serialize());
  st = fired.get_future().get();
  // When the last byte had landed here: the writer's completions can come
  // before the target's copy is done (shm with CUDA memory), so the
  // bandwidth is timed to this moment. steady_clock is CLOCK_MONOTONIC, the
  // same clock in both processes.
  const int64_t landed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now().time_since_epoch()).count();
  if (!st.ok()) return Send(to_parent, "E" + st.ToString()), 1;
  std::vector<uint8_t> host(bytes);
  e = cuda.Check(cuda.cuMemcpyDtoH(host.data(), dptr, bytes), "cuMemcpyDtoH");
  if (!e.empty()) return Send(to_parent, "E" + e), 1;
  std::vector<uint8_t> expected = testing::RandomBytes(5, bytes);
  if (host != expected) {
    size_t i = 0;
    while (i < bytes && host[i] == expected[i]) ++i;
    return Send(to_parent, "EGPU 1 bytes differ from the payload from byte " + std::to_string(i)), 1;
  }
  Send(to_parent, "OK" + std::to_string(landed_ns));
  Receive(from_parent);  // stay until the writer is done
  region->reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> arg;
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq != nullptr) arg[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
  }
  const size_t bytes = arg.count("bytes") ? std::stoull(arg["bytes"]) : (256u << 20);
  const int iters = arg.count("iters") ? std::stoi(arg["iters"]) : 20;
  const std::string provider = arg.count("provider") ? arg["provider"] : "shm";
  const int dst_gpu = arg.count("dst_gpu") ? std::stoi(arg["dst_gpu"]) : 1;
  ctx_on_worker = !arg.count("ctx_on_worker") || arg["ctx_on_worker"] != "0";
  if (arg.count("op_timeout_s")) op_timeout_s = std::stoi(arg["op_timeout_s"]);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines reach a log as they happen
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return 1;
  pid_t child = fork();  // before any CUDA or engine thread exists
  if (child == 0) {
    close(down[1]);  // else the child's own copy keeps its "writer done" read from ever ending
    close(up[0]);
    _exit(Receiver(provider, bytes, iters, dst_gpu, up[1], down[0]));
  }
  close(down[0]);
  close(up[1]);
  auto fail = [&](const std::string& what) {
    std::printf("FAIL: %s\n", what.c_str());
    std::fflush(stdout);
    kill(child, SIGKILL);
    // A process holding a GPU context can take a while to go; don't hang on it.
    for (int i = 0; i < 100 && waitpid(child, nullptr, WNOHANG) == 0; ++i) usleep(100000);
    return 1;
  };
  Cuda cuda;
  std::string e = cuda.Load();
  uint64_t sptr = 0;
  if (e.empty()) e = cuda.Alloc(0, bytes, &sptr);
  if (!e.empty()) return fail("GPU 0: " + e);
  std::vector<uint8_t> payload = testing::RandomBytes(5, bytes);
  e = cuda.Check(cuda.cuMemcpyHtoD(sptr, payload.data(), bytes), "cuMemcpyHtoD");
  if (!e.empty()) return fail(e);
  auto engine = fabric::CreateLibfabricEngine(Options(provider, 0, cuda.pci_bus_id, ctx_on_worker ? &cuda : nullptr));
  if (!engine.ok()) return fail("GPU 0 engine: " + engine.status().ToString());
  std::printf("GPU 0 (%s) engine: %s\n", cuda.pci_bus_id.c_str(), (*engine)->Describe().c_str());
  std::fflush(stdout);
  auto region = (*engine)->Register(reinterpret_cast<void*>(sptr), bytes, MemoryKind::kCuda, 0);
  if (!region.ok()) return fail("register GPU 0 memory: " + region.status().ToString());
  std::string msg = Receive(up[0]);
  if (msg.empty() || msg[0] != 'D') return fail("receiver: " + (msg.empty() ? std::string("died") : msg.substr(1)));
  auto desc = MemoryDescriptor::Parse(std::string_view(msg).substr(1));
  if (!desc.ok()) return fail(desc.status().ToString());
  auto remote = (*engine)->Import(*desc);
  if (!remote.ok()) return fail(remote.status().ToString());
  auto write_all = [&](int n) -> Status {
    std::vector<std::promise<Status>> done(n);
    for (int i = 0; i < n; ++i) {
      Status st = (*engine)->Write({region->get(), 0, *remote, 0, bytes, 77u},
                                   [&done, i](const Status& s) { done[i].set_value(s); });
      if (!st.ok()) return st;
    }
    for (auto& d : done) {
      Status st = d.get_future().get();
      if (!st.ok()) return st;
    }
    return Status::Ok();
  };
  Status st = write_all(1);  // warm-up: IPC handles, connections
  if (!st.ok()) return fail("warm-up write: " + st.ToString());
  const auto t0 = std::chrono::steady_clock::now();
  st = write_all(iters);
  const double local_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!st.ok()) return fail("write: " + st.ToString());
  msg = Receive(up[0]);
  if (msg.rfind("OK", 0) != 0) return fail("receiver: " + (msg.empty() ? std::string("died") : msg.substr(1)));
  const auto landed = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(std::stoll(msg.substr(2))));
  const double secs = std::max(local_secs, std::chrono::duration<double>(landed - t0).count());
  const double gb = iters * static_cast<double>(bytes) / 1e9;
  std::printf("PASS: %d writes of %zu KiB GPU0 -> GPU%d (%s, FI_HMEM cuda), verified; %.2f GB/s "
              "(to the last byte landing at the target; %.2f GB/s by the writer's completions)\n",
              iters, bytes >> 10, dst_gpu, provider.c_str(), gb / secs, gb / local_secs);
  close(down[1]);
  waitpid(child, nullptr, 0);
  return 0;
}
