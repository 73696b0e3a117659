// `wsync doctor`: what this machine can do for wsync and what is missing,
// each with its fix; exit status 1 when what was asked for cannot work.
//
// Every probe is the real thing where it can be: a transport engine is
// created per libfabric provider (the agents' own code path), CUDA memory
// registration is tried the way an agent tries it, the job secret is loaded
// as the controller loads it, and the Python package is imported by the
// interpreter that would run it. The rest reads the kernel's own files
// (/sys, /proc) and the CUDA driver (dlopen: no CUDA needed to build or run).
#include <dlfcn.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "controller/auth.h"
#include "transport/libfabric/libfabric_engine.h"

namespace wsync::cli {
namespace {

enum class Verdict { kOk, kInfo, kWarn, kFail };
const char* Tag(Verdict v) {
  switch (v) {
    case Verdict::kOk: return " ok ";
    case Verdict::kInfo: return " -- ";
    case Verdict::kWarn: return "warn";
    default: return "FAIL";
  }
}

struct Finding {
  std::string check;
  Verdict verdict = Verdict::kOk;
  std::string detail;
  std::string fix;  // what to do, where not ok
};

struct DoctorOptions {
  std::string provider;  // must work; empty: whichever works
  bool gpu = false;      // GPU memory must be writable directly
  std::string secret_file;
  std::string python = "python3";
  bool no_python = false;
  std::string format = "text";
  std::string sysfs = "/sys";  // for tests: a tree shaped like /sys
};

std::string ReadLine(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string line;
  std::getline(f, line);
  return line;
}

// The engines wsync knows, in the order agents are usually told to use them.
constexpr std::array<const char*, 4> kProviders = {"efa", "verbs;ofi_rxm", "shm", "tcp;ofi_rxm"};

void CheckProviders(const DoctorOptions& o, std::vector<Finding>* out) {
  std::vector<std::string> names(kProviders.begin(), kProviders.end());
  if (!o.provider.empty() && std::find(names.begin(), names.end(), o.provider) == names.end()) {
    names.push_back(o.provider);
  }
  bool any = false;
  for (const std::string& name : names) {
    transport::fabric::LibfabricOptions lo;
    lo.provider = name;
    StatusOr<std::unique_ptr<transport::Engine>> engine = transport::fabric::CreateLibfabricEngine(lo);
    const bool asked = o.provider == name;
    if (engine.ok()) {
      any = true;
      // A host-memory engine: its line ends "CUDA memory no" even where the
      // provider takes GPU memory, which the check of GPU memory below opens
      // an engine with FI_HMEM for; that part is left to it.
      std::string d = (*engine)->Describe();
      const size_t cuda = d.find(", CUDA memory ");
      if (cuda != std::string::npos) {
        const size_t caveat = d.find("; caveat: ", cuda);
        d.erase(cuda, caveat == std::string::npos ? std::string::npos : caveat - cuda);
      }
      out->push_back({"libfabric " + name, Verdict::kOk, d, ""});
    } else {
      out->push_back({"libfabric " + name, asked ? Verdict::kFail : Verdict::kInfo, engine.status().message(),
                      asked ? "the provider you asked for must work: install or load it (`fi_info -l`)" : ""});
    }
  }
  if (!any) {
    out->push_back({"libfabric", Verdict::kFail, "no provider wsync can use",
                    "install libfabric with shm and tcp (Debian: libfabric1; bash scripts/install_deps.sh)"});
  }
}

// The CUDA driver, through its C API without linking it.
struct CudaDriver {
  void* lib = nullptr;
  int (*cuInit)(unsigned) = nullptr;
  int (*cuDriverGetVersion)(int*) = nullptr;
  int (*cuDeviceGetCount)(int*) = nullptr;
  int (*cuDeviceGet)(int*, int) = nullptr;
  int (*cuDeviceGetName)(char*, int, int) = nullptr;
  int (*cuDeviceGetPCIBusId)(char*, int, int) = nullptr;
  ~CudaDriver() {
    if (lib != nullptr) dlclose(lib);
  }
  bool Load() {
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto sym = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name)); };
    sym(cuInit, "cuInit");
    sym(cuDriverGetVersion, "cuDriverGetVersion");
    sym(cuDeviceGetCount, "cuDeviceGetCount");
    sym(cuDeviceGet, "cuDeviceGet");
    sym(cuDeviceGetName, "cuDeviceGetName");
    sym(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
    return cuInit && cuDriverGetVersion && cuDeviceGetCount && cuDeviceGet && cuDeviceGetName && cuDeviceGetPCIBusId;
  }
};

// sysfs's numa_node: -1 where the platform gives no affinity (one node, or
// a VM that hides it), which is no node to pin to.
std::string NumaText(const std::string& node) {
  if (node == "-1") return "none reported (-1: one node, or a VM)";
  return node.empty() ? "?" : node;
}

std::string NumaOfPci(const DoctorOptions& o, std::string bus_id) {
  for (char& c : bus_id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string node = ReadLine(std::filesystem::path(o.sysfs) / "bus/pci/devices" / bus_id / "numa_node");
  return NumaText(node);
}

int CheckGpus(const DoctorOptions& o, std::vector<Finding>* out) {
  CudaDriver cuda;
  const Verdict missing = o.gpu ? Verdict::kFail : Verdict::kInfo;
  if (!cuda.Load()) {
    out->push_back({"GPUs", missing, "no CUDA driver (libcuda.so.1 not found)",
                    o.gpu ? "install the NVIDIA driver, or in a container run with the GPU runtime (--gpus all)" : ""});
    return 0;
  }
  int count = 0, version = 0;
  if (cuda.cuInit(0) != 0 || cuda.cuDeviceGetCount(&count) != 0 || count == 0) {
    out->push_back({"GPUs", missing, "the CUDA driver is present but sees no GPU",
                    o.gpu ? "check nvidia-smi; in a container, pass the GPUs (--gpus all, CUDA_VISIBLE_DEVICES)" : ""});
    return 0;
  }
  cuda.cuDriverGetVersion(&version);
  std::ostringstream d;
  d << count << " (driver CUDA " << version / 1000 << "." << (version % 1000) / 10 << ")";
  for (int i = 0; i < count; ++i) {
    int dev = 0;
    char name[128] = {}, bus[32] = {};
    cuda.cuDeviceGet(&dev, i);
    cuda.cuDeviceGetName(name, sizeof name, dev);
    cuda.cuDeviceGetPCIBusId(bus, sizeof bus, dev);
    d << "; " << i << ": " << name << " " << bus << " NUMA node " << NumaOfPci(o, bus);
  }
  out->push_back({"GPUs", Verdict::kOk, d.str(), ""});
  return count;
}

void CheckGpuMemory(const DoctorOptions& o, int gpus, std::vector<Finding>* out) {
  if (gpus == 0) {
    if (o.gpu) out->push_back({"GPU memory over libfabric", Verdict::kFail, "no GPU", "see GPUs above"});
    return;
  }
  bool direct = false;
  for (const char* name : kProviders) {
    if (!o.provider.empty() && o.provider != name) continue;
    transport::fabric::LibfabricOptions lo;
    lo.provider = name;
    auto engine = transport::fabric::CreateLibfabricEngineForGpu(lo, transport::fabric::GpuMemory::kDirect);
    if (engine.ok()) {
      direct = true;
      out->push_back({std::string("GPU memory over ") + name, Verdict::kOk, "registers CUDA memory (FI_HMEM)", ""});
    } else if (o.provider == name || (o.provider.empty() && std::string(name) == "shm")) {
      out->push_back({std::string("GPU memory over ") + name, o.gpu ? Verdict::kWarn : Verdict::kInfo,
                      engine.status().message(),
                      "a libfabric built with CUDA (README, \"On a GPU machine\"), or the EFA installer's"});
    }
  }
  if (!direct) {
    out->push_back({"GPU memory", o.gpu ? Verdict::kFail : Verdict::kWarn,
                    "no provider here writes GPU memory directly: GPU weights would be staged through host memory "
                    "(staging=\"on\"), one extra copy of every byte",
                    "a libfabric built with CUDA and cuda-dlopen (README, \"On a GPU machine\")"});
  }
}

void CheckNics(const DoctorOptions& o, std::vector<Finding>* out) {
  const std::filesystem::path ib = std::filesystem::path(o.sysfs) / "class/infiniband";
  std::error_code ec;
  std::ostringstream d;
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ib, ec)) {
    const std::string dev = entry.path().filename().string();
    const std::string driver =
        std::filesystem::read_symlink(entry.path() / "device/driver", ec).filename().string();
    const std::string state = ReadLine(entry.path() / "ports/1/state");
    const std::string rate = ReadLine(entry.path() / "ports/1/rate");
    const std::string numa = ReadLine(entry.path() / "device/numa_node");
    d << (n++ ? "; " : "") << dev << " (" << (driver.empty() ? "?" : driver) << ", " << (state.empty() ? "?" : state)
      << (rate.empty() ? "" : ", " + rate) << ", NUMA node " << NumaText(numa) << ")";
  }
  if (n == 0) {
    const bool asked = o.provider == "efa" || o.provider == "verbs;ofi_rxm";
    out->push_back({"RDMA NICs", asked ? Verdict::kFail : Verdict::kInfo,
                    "none (" + ib.string() + " is empty or absent): shm within a host and tcp between hosts only",
                    asked ? "load the NIC's driver (efa, mlx5_ib); in a container pass /dev/infiniband" : ""});
    return;
  }
  out->push_back({"RDMA NICs", Verdict::kOk, d.str(), ""});
}

// `pinning`: a provider that pins what it registers (efa, verbs) is usable
// or asked for.
void CheckLimits(bool pinning, std::vector<Finding>* out) {
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  if (lim.rlim_cur == RLIM_INFINITY) {
    out->push_back({"memlock limit", Verdict::kOk, "unlimited", ""});
  } else {
    out->push_back({"memlock limit", pinning ? Verdict::kWarn : Verdict::kInfo,
                    std::to_string(lim.rlim_cur >> 10) + " KiB: efa and verbs pin every region they register "
                    "(the weights, the trainer's staging), and registration fails past this",
                    "ulimit -l unlimited (systemd: LimitMEMLOCK=infinity; docker: --ulimit memlock=-1)"});
  }
  struct statvfs shm {};
  if (statvfs("/dev/shm", &shm) == 0) {
    const double gib = static_cast<double>(shm.f_bavail) * static_cast<double>(shm.f_frsize) / (1 << 30);
    char text[128];
    std::snprintf(text, sizeof text, "/dev/shm: %.1f GiB free", gib);
    if (gib < 1.0) {
      out->push_back({"shared memory", Verdict::kWarn,
                      std::string(text) + ": the shm provider and the sidecars' weight store and shard export live "
                      "there",
                      "docker: --shm-size=16g (its default is 64 MiB); Kubernetes: an emptyDir with medium Memory"});
    } else {
      out->push_back({"shared memory", Verdict::kOk, text, ""});
    }
  } else {
    out->push_back({"shared memory", Verdict::kWarn, "no /dev/shm", "mount a tmpfs at /dev/shm"});
  }
  const std::string thp = ReadLine("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!thp.empty()) out->push_back({"transparent huge pages", Verdict::kInfo, thp, ""});
}

void CheckCudaIpc(const DoctorOptions& o, int gpus, std::vector<Finding>* out) {
  if (gpus == 0) return;
  const std::string scope = ReadLine("/proc/sys/kernel/yama/ptrace_scope");
  // CUDA IPC handles open only between processes that see each other: one
  // PID namespace (containers: the same pod, or --pid=host --ipc=host).
  std::string d = "the sidecars open the trainer's and the engine's GPU memory through CUDA IPC handles";
  if (!scope.empty()) d += "; kernel.yama.ptrace_scope = " + scope;
  const bool strict = !scope.empty() && scope >= "2";
  out->push_back({"CUDA IPC", strict ? Verdict::kWarn : Verdict::kInfo, d,
                  strict ? "ptrace_scope 2 or 3 blocks CUDA IPC between unrelated processes: sysctl "
                           "kernel.yama.ptrace_scope=1, or run the in-process routes (Python) instead"
                         : "in containers, run trainer and sidecar in one PID and IPC namespace (--pid=host "
                           "--ipc=host, or one pod)"});
}

void CheckSecret(const DoctorOptions& o, std::vector<Finding>* out) {
  StatusOr<std::optional<controller::JobSecret>> s = controller::LoadJobSecret(o.secret_file);
  if (!s.ok()) {
    out->push_back({"job secret", Verdict::kFail, s.status().message(), ""});  // the message says what to do
  } else if (!s->has_value()) {
    out->push_back({"job secret", Verdict::kWarn,
                    "none given (--secret-file or $WSYNC_SECRET_FILE): the control plane would accept anyone's "
                    "requests",
                    "wsync secret /path/job.secret, then --secret-file it to the controller and every agent"});
  } else {
    out->push_back({"job secret", Verdict::kOk, (*s)->source() + ", loaded as the controller loads it", ""});
  }
}

void CheckPython(const DoctorOptions& o, std::vector<Finding>* out) {
  if (o.no_python) return;
  // Passed with -c in single quotes: the probe uses double quotes only.
  const std::string probe =
      "import json\n"
      "r = {}\n"
      "try:\n"
      "    import torch\n"
      "    r[\"torch\"] = torch.__version__; r[\"cuda\"] = torch.version.cuda; r[\"gpu\"] = torch.cuda.is_available()\n"
      "except Exception as e:\n"
      "    r[\"torch_error\"] = str(e)\n"
      "try:\n"
      "    import wsync._C\n"
      "    r[\"wsync\"] = wsync.__file__\n"
      "except Exception as e:\n"
      "    r[\"wsync_error\"] = str(e)\n"
      "print(json.dumps(r))\n";
  const std::string cmd = "timeout 120 " + o.python + " -c '" + probe + "' 2>/dev/null";
  std::string text;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p) != nullptr) text += buf;
    pclose(p);
  }
  nlohmann::json r = nlohmann::json::parse(text, nullptr, false);
  if (!r.is_object()) {
    out->push_back({"Python (" + o.python + ")", Verdict::kInfo, "not runnable",
                    "only the in-process routes need Python: --python PATH names the interpreter"});
    return;
  }
  if (r.contains("torch_error")) {
    out->push_back({"torch (" + o.python + ")", Verdict::kInfo, r["torch_error"].get<std::string>(),
                    "the in-process routes need torch in this interpreter"});
  } else {
    out->push_back({"torch (" + o.python + ")", Verdict::kOk,
                    r["torch"].get<std::string>() + ", CUDA " +
                        (r["cuda"].is_string() ? r["cuda"].get<std::string>() : std::string("none (CPU build)")) +
                        (r["gpu"].get<bool>() ? ", sees a GPU" : ", sees no GPU"),
                    ""});
  }
  if (r.contains("wsync_error")) {
    out->push_back({"wsync Python package", Verdict::kInfo, r["wsync_error"].get<std::string>(),
                    "pip install --no-build-isolation ./python (in the interpreter that has torch)"});
  } else {
    out->push_back({"wsync Python package", Verdict::kOk, r["wsync"].get<std::string>(), ""});
  }
}

int RunDoctor(const DoctorOptions& o) {
  std::vector<Finding> f;
  CheckProviders(o, &f);
  const int gpus = CheckGpus(o, &f);
  CheckGpuMemory(o, gpus, &f);
  CheckNics(o, &f);
  bool pinning = o.provider == "efa" || o.provider == "verbs;ofi_rxm";
  for (const Finding& x : f) {
    pinning = pinning || ((x.check == "libfabric efa" || x.check == "libfabric verbs;ofi_rxm") && x.verdict == Verdict::kOk);
  }
  CheckLimits(pinning, &f);
  CheckCudaIpc(o, gpus, &f);
  CheckSecret(o, &f);
  CheckPython(o, &f);
  bool failed = false;
  for (const Finding& x : f) failed = failed || x.verdict == Verdict::kFail;
  if (o.format == "json") {
    nlohmann::json j = nlohmann::json::array();
    for (const Finding& x : f) {
      j.push_back({{"check", x.check}, {"verdict", Tag(x.verdict)}, {"detail", x.detail}, {"fix", x.fix}});
    }
    std::cout << nlohmann::json{{"ok", !failed}, {"findings", j}}.dump(1) << "\n";
  } else {
    for (const Finding& x : f) {
      std::cout << "[" << Tag(x.verdict) << "] " << x.check << ": " << x.detail << "\n";
      if (!x.fix.empty() && x.verdict != Verdict::kOk) std::cout << "       fix: " << x.fix << "\n";
    }
    std::cout << (failed ? "wsync doctor: what you asked for cannot work here (FAIL above)"
                         : "wsync doctor: nothing you asked for is missing")
              << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace

void AddDoctorCommand(CLI::App& app) {
  auto o = std::make_shared<DoctorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "doctor",
      "Say what this machine can do for wsync and what is missing, each with its fix: libfabric providers (an "
      "engine is opened on each), GPU memory registration, GPUs and RDMA NICs with their NUMA nodes, the memlock "
      "limit, /dev/shm, CUDA IPC, the job secret, torch and the wsync Python package. Exit status 1 when what "
      "you ask for (--provider, --gpu) cannot work.");
  cmd->add_option("--provider", o->provider, "a provider that must work here, e.g. efa, shm, \"tcp;ofi_rxm\"");
  cmd->add_flag("--gpu", o->gpu, "GPU weights must be written directly (FI_HMEM)");
  cmd->add_option("--secret-file", o->secret_file, "the job secret to check (default $WSYNC_SECRET_FILE)");
  cmd->add_option("--python", o->python, "the interpreter of the in-process routes")->capture_default_str();
  cmd->add_flag("--no-python", o->no_python, "skip the Python checks");
  cmd->add_option("--format", o->format, "output format")->check(CLI::IsMember({"text", "json"}));
  cmd->add_option("--sysfs", o->sysfs, "where sysfs is (tests)")->group("");
  cmd->callback([o] { std::exit(RunDoctor(*o)); });
}

}  // namespace wsync::cli
