// wsync._C: the thin layer between Python (python/wsync/) and the C++ core.
// Everything that blocks releases the GIL; every error leaves as one
// RuntimeError whose text is the Status message (it names the rank, the
// stage and the tensor). The Python package builds the metadata and the
// process groups; this file only converts.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "python/src/inference_binding.h"
#include "python/src/torch_groups.h"
#include "python/src/trainer_binding.h"
#include "routing/spec_io.h"
#include "trainer_agent/shard_export.h"
#include "trainer_agent/version_step.h"

namespace py = pybind11;
using namespace wsync;          // NOLINT: a binding file
using namespace wsync::python;  // NOLINT

namespace {

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

[[noreturn]] void Raise(const Status& s) { throw std::runtime_error(s.message()); }

template <typename T>
T Take(StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return std::move(v).value();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

// Runs a blocking call with the GIL released, then raises its error.
template <typename Fn>
void CheckWithoutGil(Fn&& fn) {
  Status st;
  {
    py::gil_scoped_release nogil;
    st = fn();
  }
  Check(st);
}

nlohmann::json ParseJson(const std::string& text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string(what) + " is not JSON: " + e.what());
  }
}

// The config the Python layer sends, its keys checked: a misspelled or
// unknown one is an error here, never a default taken in silence.
nlohmann::json ParseConfig(const std::string& text, const char* what, std::initializer_list<const char*> keys) {
  nlohmann::json c = ParseJson(text, what);
  if (!c.is_object()) throw std::invalid_argument(std::string(what) + " is not a JSON object");
  for (const auto& [key, value] : c.items()) {
    bool known = false;
    for (const char* k : keys) known = known || key == k;
    if (!known) throw std::invalid_argument(std::string(what) + ": unknown key '" + key + "'");
  }
  return c;
}

// A push's handle: the pipeline thread's state plus the controller, for
// waiting on the whole version.
struct PushHandle {
  std::shared_ptr<PushState> state;
  controller::ControllerClient client;
  int32_t rank;

  bool WaitReadsDone(double timeout_s) {
    py::gil_scoped_release nogil;
    return state->WaitReadsDone(Ms(timeout_s));
  }

  // This rank's report; with `complete`, also waits for the version to be
  // complete at every inference rank (raises if it failed anywhere). A
  // version the controller has already failed (a dead peer, seen by its
  // heartbeats) ends the wait at once, even while this rank's pipeline still
  // waits out its transport timeout.
  std::string Wait(double timeout_s, bool complete) {
    StatusOr<nlohmann::json> out = Internal("not run");
    {
      py::gil_scoped_release nogil;
      out = WaitNoGil(timeout_s, complete);
    }
    if (!out.ok()) Raise(out.status());
    return out->dump();
  }

 private:
  // `skip_trainer`: a trainer rank whose own report the caller shows apart.
  static std::string Failures(const controller::VersionStatus& v, int32_t skip_trainer = -1) {
    std::string why;
    for (const controller::VersionFailure& f : v.failures) {
      if (f.role == "trainer" && f.rank == skip_trainer && v.failures.size() > 1) continue;
      why += (why.empty() ? "" : "; ") + f.role + " rank " + std::to_string(f.rank) + ": " + f.error;
    }
    return "version " + std::to_string(v.version) + " failed: " + why;
  }

  StatusOr<nlohmann::json> WaitNoGil(double timeout_s, bool complete) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + Ms(timeout_s);
    const uint64_t version = state->version();
    StatusOr<VersionReport> report = Internal("not run");
    while (true) {
      const auto slice = std::min<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(500));
      report = state->Wait(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max<Clock::duration>(slice, Clock::duration::zero())));
      if (report.ok() || state->done() || Clock::now() >= deadline) break;
      StatusOr<controller::VersionStatus> v = client.GetVersion(version);
      if (v.ok() && v->failed()) return Aborted(Failures(*v));
    }
    if (!report.ok()) {
      // A local failure is often only the echo of a peer's (a collective
      // broken by a rank that gave up on a dead engine): lead with what the
      // controller knows to be the cause.
      StatusOr<controller::VersionStatus> v = client.GetVersion(version);
      if (v.ok() && v->failed()) {
        return Aborted(Failures(*v, rank) + " [trainer rank " + std::to_string(rank) + " saw: " + report.status().message() +
                       "]");
      }
      return report.status();
    }
    nlohmann::json out = trainer_agent::VersionStats(*report);
    out["version"] = version;
    out["rank"] = rank;
    if (complete) {
      StatusOr<controller::VersionStatus> v = client.WaitVersion(version, deadline);
      if (!v.ok()) {
        return v.status().WithContext("trainer rank " + std::to_string(rank) + ": waiting for version " +
                                      std::to_string(version) + " to complete");
      }
      if (v->failed()) return Aborted(Failures(*v));
      out["version_seconds"] = v->seconds;
      out["state"] = v->state;
    }
    return out;
  }
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "wsync's C++ core (see the wsync package)";

  py::class_<PushHandle>(m, "PushHandle")
      .def_property_readonly("version", [](const PushHandle& h) { return h.state->version(); })
      .def("wait_reads_done", &PushHandle::WaitReadsDone, py::arg("timeout_s"))
      .def("wait", &PushHandle::Wait, py::arg("timeout_s"), py::arg("complete") = true)
      .def("done", [](PushHandle& h) { return h.state->done(); });

  py::class_<TrainerSession>(m, "TrainerSession")
      .def(py::init([](const std::string& config_json, const py::list& process_groups) {
             const nlohmann::json c =
                 ParseConfig(config_json, "trainer config",
                             {"registration", "controller", "secret_file", "tls_ca_file", "job", "provider", "nics",
                              "node", "watermark_bytes", "checksums", "timeout_s", "cuda_device", "host_shards",
                              "staging", "delta"});
             TrainerConfig config;
             config.registration = c.at("registration");
             config.controller = c.at("controller").get<std::string>();
             config.secret_file = c.value("secret_file", std::string());
             config.tls_ca_file = c.value("tls_ca_file", std::string());
             config.job = c.at("job").get<std::string>();
             config.provider = c.value("provider", std::string("shm"));
             config.nics = c.value("nics", 1u);
             config.node = c.value("node", std::string());
             config.watermark_bytes = c.value("watermark_bytes", config.watermark_bytes);
             config.checksums = c.value("checksums", false);
             config.deltas = c.value("delta", false);
             config.timeout = Ms(c.value("timeout_s", 300.0));
             config.cuda_device = c.value("cuda_device", -1);
             config.host_shards = c.value("host_shards", false);
             config.staging = c.value("staging", std::string("auto"));
             std::vector<TorchProcessGroup> groups;
             for (const py::handle& item : process_groups) {
               auto pair = item.cast<py::tuple>();
               groups.push_back({pair[0].cast<std::vector<int32_t>>(),
                                 pair[1].cast<c10::intrusive_ptr<c10d::ProcessGroup>>()});
             }
             py::gil_scoped_release nogil;
             auto factory = MakeTorchGroupFactory(std::move(groups), config.timeout, config.cuda_device);
             StatusOr<std::unique_ptr<TrainerSession>> s = TrainerSession::Create(std::move(config), std::move(factory));
             py::gil_scoped_acquire gil;
             return Take(std::move(s));
           }),
           py::arg("config_json"), py::arg("process_groups"))
      .def(
          "push",
          [](TrainerSession& s, uint64_t version, const std::vector<std::tuple<std::string, uintptr_t, uint64_t>>& shards) {
            std::vector<ShardPointer> pointers;
            pointers.reserve(shards.size());
            for (const auto& [name, ptr, bytes] : shards) {
              pointers.push_back({name, reinterpret_cast<const uint8_t*>(ptr), bytes});
            }
            std::optional<StatusOr<std::shared_ptr<PushState>>> state;
            {
              py::gil_scoped_release nogil;
              state.emplace(s.Push(version, std::move(pointers)));
            }
            return PushHandle{Take(std::move(*state)), s.client(), s.rank()};
          },
          py::arg("version"), py::arg("shards"))
      .def("describe", [](const TrainerSession& s) { return s.Describe().dump(); })
      .def("replay_writes",
           [](TrainerSession& s) {
             std::optional<StatusOr<VersionReport>> report;
             {
               py::gil_scoped_release nogil;
               report.emplace(s.ReplayWrites());
             }
             return trainer_agent::VersionStats(Take(std::move(*report))).dump();
           })
      .def("close", [](TrainerSession& s) {
        py::gil_scoped_release nogil;
        s.Close();
      });

  py::class_<InferenceSession>(m, "InferenceSession")
      .def(py::init([](const std::string& config_json,
                       const std::vector<std::tuple<std::string, uintptr_t, uint64_t, bool, int>>& regions) {
             const nlohmann::json c =
                 ParseConfig(config_json, "inference config",
                             {"rank", "controller", "secret_file", "tls_ca_file", "provider", "nics", "node",
                              "timeout_s", "verify_checksums", "shadow", "staging", "paced", "delta"});
             InferenceConfig config;
             config.rank = c.at("rank");
             config.controller = c.at("controller").get<std::string>();
             config.secret_file = c.value("secret_file", std::string());
             config.tls_ca_file = c.value("tls_ca_file", std::string());
             config.provider = c.value("provider", std::string("shm"));
             config.nics = c.value("nics", 1u);
             config.node = c.value("node", std::string());
             config.timeout = Ms(c.value("timeout_s", 300.0));
             config.verify_checksums = c.value("verify_checksums", false);
             config.shadow = c.value("shadow", false);
             config.staging = c.value("staging", std::string("auto"));
             config.paced = c.value("paced", false);
             config.deltas = c.value("delta", false);
             auto to_regions = [](const auto& list) {
               std::vector<inference::WeightMemory::Region> rs;
               for (const auto& [id, ptr, size, cuda, device] : list) {
                 rs.push_back({id, reinterpret_cast<uint8_t*>(ptr), size,
                               cuda ? transport::MemoryKind::kCuda : transport::MemoryKind::kHost, device});
               }
               return rs;
             };
             std::vector<inference::WeightMemory::Region> rs = to_regions(regions);
             py::gil_scoped_release nogil;
             StatusOr<std::unique_ptr<InferenceSession>> s =
                 InferenceSession::Create(std::move(config), std::move(rs));
             py::gil_scoped_acquire gil;
             return Take(std::move(s));
           }),
           py::arg("config_json"), py::arg("regions"))
      .def("wait_version",
           [](InferenceSession& s, uint64_t v, double timeout_s) {
             CheckWithoutGil([&] { return s.WaitVersion(v, Ms(timeout_s)); });
           },
           py::arg("version"), py::arg("timeout_s"))
      .def("verify",
           [](InferenceSession& s, uint64_t v, double timeout_s) {
             CheckWithoutGil([&] { return s.Verify(v, Ms(timeout_s)); });
           },
           py::arg("version"), py::arg("timeout_s"))
      .def("update",
           [](InferenceSession& s, uint64_t v, double timeout_s) {
             std::optional<StatusOr<inference::UpdateReport>> r;
             {
               py::gil_scoped_release nogil;
               r.emplace(s.Update(v == 0 ? std::nullopt : std::optional<uint64_t>(v), Ms(timeout_s)));
             }
             if (!r->ok() && r->status().code() == StatusCode::kDeadlineExceeded) {
               PyErr_SetString(PyExc_TimeoutError, r->status().message().c_str());
               throw py::error_already_set();
             }
             const inference::UpdateReport u = Take(std::move(*r));
             return nlohmann::json{{"version", u.version}, {"previous", u.previous}, {"seconds", u.seconds},
                                   {"wait_seconds", u.wait_seconds}, {"copy_seconds", u.copy_seconds}}
                 .dump();
           },
           py::arg("version"), py::arg("timeout_s"))
      .def_property_readonly("pacing", &InferenceSession::pacing)
      .def_property_readonly("complete_version", &InferenceSession::complete_version)
      .def_property_readonly("failed_version", &InferenceSession::failed_version)
      .def_property_readonly("staged", &InferenceSession::staged)
      .def("close", [](InferenceSession& s) {
        py::gil_scoped_release nogil;
        s.Close();
      });

  // The sidecar route's trainer side: shards in shared memory for a
  // `wsync trainer-agent` process (trainer_agent/shard_export.h).
  py::class_<trainer_agent::ShardExport>(m, "ShardExport")
      .def(py::init([](const std::string& job, const std::string& spec_json, int32_t rank, bool cuda_ipc) {
             const nlohmann::json doc = ParseJson(spec_json, "trainer spec");
             TrainerSpec spec = Take(ParseTrainerSpec(doc, "wsync.export_shards"));
             for (const TrainerRank& r : spec.ranks) {
               if (r.rank != rank) continue;
               std::string name = Take(trainer_agent::ShardRegionName(job, rank));
               return Take(trainer_agent::ShardExport::Create(
                   name, r, cuda_ipc ? trainer_agent::ShardPlacement::kCudaIpc : trainer_agent::ShardPlacement::kInRegion));
             }
             Raise(NotFound("wsync.export_shards: no trainer rank " + std::to_string(rank) + " in the spec"));
           }),
           py::arg("job"), py::arg("spec_json"), py::arg("rank"), py::arg("cuda_ipc") = false)
      .def("tensor",
           [](const trainer_agent::ShardExport& e, const std::string& name) {
             trainer_agent::ShardTensor t = Take(e.Tensor(name));
             return std::make_pair(reinterpret_cast<uintptr_t>(t.data), t.bytes);
           })
      .def("copy_in",
           [](const trainer_agent::ShardExport& e, const std::string& name, uintptr_t src, uint64_t bytes) {
             trainer_agent::ShardTensor t = Take(e.Tensor(name));
             if (t.bytes != bytes) {
               Raise(InvalidArgument("wsync.export_shards: tensor '" + name + "' is " + std::to_string(bytes) +
                                     " bytes, its export slot " + std::to_string(t.bytes)));
             }
             py::gil_scoped_release nogil;
             std::memcpy(t.data, reinterpret_cast<const void*>(src), bytes);
           })
      .def("publish", [](trainer_agent::ShardExport& e, uint64_t v) { Check(e.Publish(v)); })
      .def("wait_reads_done",
           [](const trainer_agent::ShardExport& e, uint64_t v, double timeout_s) {
             Status st;
             {
               py::gil_scoped_release nogil;
               st = e.WaitReadsDone(v, Ms(timeout_s));
             }
             Check(st);
           })
      .def_property_readonly("region_name", &trainer_agent::ShardExport::region_name)
      .def_property_readonly("reads_done_version", &trainer_agent::ShardExport::reads_done_version)
      .def_property_readonly("failed_version", &trainer_agent::ShardExport::failed_version);
}
