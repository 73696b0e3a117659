// Writes the seed corpus of every fuzz target (docs/FUZZING.md) from the
// repository's own fixtures and examples, at build time:
//   fuzz_make_seeds SOURCE_DIR OUT_DIR
// Copies the spec and mapping files as they are, and generates what only
// exists at run time: plans and plan slices of the fixture worlds, specs of
// the small examples (fp8 scales included), descriptor bytes, controller
// request scripts and a state dir. Idempotent: rewrites the same files;
// inputs libFuzzer added to OUT_DIR/<target>/ are left alone.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/controller.h"
#include "delta/codec.h"
#include "models/generate.h"
#include "routing/json_reader.h"
#include "routing/plan_io.h"
#include "routing/planner.h"
#include "routing/rank_plan.h"
#include "routing/spec_io.h"
#include "transport/engine.h"

using namespace wsync;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string src_dir, out_dir;
int written = 0;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "fuzz_make_seeds: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().message());
  return std::move(v).value();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(out_dir) / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) Die("cannot write " + (dir / name).string());
  ++written;
}

void CopySeed(const std::string& target, const std::string& rel) {
  Seed(target, fs::path(rel).filename().string(), ReadText(src_dir + "/" + rel));
}

std::string Src(const std::string& rel) { return src_dir + "/" + rel; }

// A descriptor as an engine would hand it out.
transport::MemoryDescriptor Descriptor(int nics) {
  transport::MemoryDescriptor d;
  d.address = 0x7f0000001000;
  d.length = 2048;
  for (int i = 0; i < nics; ++i) d.nics.push_back({"fi_addr_" + std::to_string(i), 0x1000u + i});
  return d;
}

void SpecsAndPlans() {
  for (const char* f : {"tests/cli/data/good/trainer.json", "tests/routing/data/tiny_trainer.json"})
    CopySeed("trainer_spec", f);
  for (const char* f : {"tests/cli/data/good/inference.json", "tests/routing/data/tiny_inference.json"})
    CopySeed("inference_spec", f);
  CopySeed("mapping_spec", "tests/cli/data/good/mapping.json");
  CopySeed("mapping_spec", "tests/routing/data/tiny_mapping.json");
  for (const auto& e : fs::directory_iterator(Src("configs/mappings")))
    if (e.path().extension() == ".json") CopySeed("mapping_spec", "configs/mappings/" + e.path().filename().string());

  // Small generated worlds: fp8 block scales, experts, several hosts.
  for (const char* ex : {"tiny-moe-4x2", "small-moe-fp8-4x2", "small-moe-hf-fp8-4x2-ep"}) {
    GeneratedSpecs g = Must(GenerateFromClusterFile(Src(std::string("examples/") + ex + "/cluster.json")), ex);
    Seed("trainer_spec", std::string(ex) + ".json", ToJson(g.trainer).dump());
    Seed("inference_spec", std::string(ex) + ".json", ToJson(g.inference).dump());
    const RoutingTable table = Must(Plan(g.trainer, g.inference, g.mapping), std::string("plan ") + ex);
    Seed("plan_file", std::string(ex) + ".json", PlanToJson(table).dump());
  }

  // The fixture worlds' plans and every rank's slice.
  struct World {
    const char* name;
    const char *trainer, *inference, *mapping, *config;
  };
  for (const World& w : {World{"good", "tests/cli/data/good/trainer.json", "tests/cli/data/good/inference.json",
                               "tests/cli/data/good/mapping.json", nullptr},
                         World{"tiny", "tests/routing/data/tiny_trainer.json",
                               "tests/routing/data/tiny_inference.json", "tests/routing/data/tiny_mapping.json",
                               "tests/routing/data/tiny_config.json"}}) {
    const TrainerSpec trainer = Must(ParseTrainerSpecFromFile(Src(w.trainer)), w.trainer);
    InferenceSpec inference = Must(ParseInferenceSpecFromFile(Src(w.inference)), w.inference);
    for (InferenceRank& r : inference.ranks)
      for (MemoryRegion& m : r.regions) m.descriptor = Descriptor(1 + r.rank % 2).ToText();
    Seed("inference_spec", std::string(w.name) + "_with_descriptors.json", ToJson(inference).dump(1));
    json config;
    if (w.config) config = Must(ReadJsonFile(Src(w.config)), w.config);
    const MappingSpec mapping =
        Must(ParseMappingSpecFromFile(Src(w.mapping), w.config ? &config : nullptr), w.mapping);
    const RoutingTable table = Must(Plan(trainer, inference, mapping), std::string("plan ") + w.name);
    Seed("plan_file", std::string(w.name) + ".json", PlanToJson(table).dump());
    for (const TrainerRank& r : trainer.ranks) {
      TrainerRankPlan p = Must(ExtractTrainerRankPlan(table, trainer, inference, r.rank), "slice");
      Seed("plan_slice", std::string(w.name) + "_trainer_" + std::to_string(r.rank) + ".json", ToJson(p).dump());
    }
    for (const InferenceRank& r : inference.ranks)
      Seed("plan_slice", std::string(w.name) + "_inference_" + std::to_string(r.rank) + ".json",
           ToJson(ExtractInferenceRankPlan(table, r.rank)).dump());
  }
}

void Descriptors() {
  for (int nics : {1, 2, 8}) {
    const transport::MemoryDescriptor d = Descriptor(nics);
    Seed("descriptor", "memory_" + std::to_string(nics) + ".bin", d.Serialize());
    Seed("descriptor", "memory_" + std::to_string(nics) + ".hex", d.ToText());
    transport::PeerAddress a;
    for (const auto& n : d.nics) a.nics.push_back(n.nic_address);
    Seed("descriptor", "peer_" + std::to_string(nics) + ".bin", a.Serialize());
  }
}

// Deltas as EncodeAndAdvance writes them, behind the target-size byte the
// target reads first (elements = byte * 613): sparse (indices) and dense
// (bitmaps) changes of 1-, 2- and 4-byte elements.
void Deltas() {
  for (uint32_t elem : {1u, 2u, 4u}) {
    for (uint64_t every : {97u, 3u}) {
      const uint8_t size_byte = 120;  // 73560 elements: a whole chunk and part of the next
      const uint64_t bytes = uint64_t{size_byte} * 613 * elem;
      std::vector<uint8_t> base(bytes), next(bytes), out(bytes * 2 + 4096);
      for (uint64_t i = 0; i < bytes; ++i) base[i] = next[i] = static_cast<uint8_t>(i * 131 + 7);
      for (uint64_t i = 0; i < bytes; i += every * elem) next[i] ^= 0x5a;
      StatusOr<delta::Encoded> e = delta::EncodeAndAdvance(base.data(), next.data(), bytes, elem, out.data(), out.size());
      if (!e.ok() || !e->fits) continue;
      std::string seed(1, static_cast<char>(size_byte));
      seed.append(reinterpret_cast<const char*>(out.data()), e->bytes);
      Seed("delta_apply", "elem" + std::to_string(elem) + "_every" + std::to_string(every) + ".bin", seed);
    }
  }
}

// The world of tests/cli/data/good as agents send it: one line per request.
void ControllerScripts() {
  const json trainer = Must(ReadJsonFile(Src("tests/cli/data/good/trainer.json")), "trainer");
  const json inference = Must(ReadJsonFile(Src("tests/cli/data/good/inference.json")), "inference");
  std::vector<std::string> reg;
  for (const json& r : trainer["ranks"]) {
    json body = r;
    body["mesh_groups"] = trainer["mesh_groups"];
    reg.push_back("trainer " + body.dump());
  }
  reg.push_back("inference " + inference["ranks"][0].dump());
  auto join = [](const std::vector<std::string>& lines) {
    std::string s;
    for (const std::string& l : lines) s += l + "\n";
    return s;
  };
  std::vector<std::string> world = reg;
  world.insert(world.end(), {"plan trainer 0", "plan trainer 1", "plan inference 0"});
  Seed("controller_requests", "register_and_plan.txt", join(world));
  std::vector<std::string> versions = world;
  versions.insert(versions.end(),
                  {"heartbeat {\"role\":\"trainer\",\"rank\":0}", "version 1 start {\"rank\":0}",
                   "version 1 start {\"rank\":1}",
                   "version 1 trainer_done {\"rank\":0,\"ok\":true,\"stats\":{\"seconds\":0.5}}",
                   "version 1 trainer_done {\"rank\":1,\"stats\":{\"checksums\":{\"0\":{\"w\":[[0,64,"
                   "\"00000000000010ff\"]]}}}}",
                   "checksums 1 0", "version 1 inference_done {\"rank\":0,\"ok\":true}",
                   "get 1", "version 2 start {\"rank\":0}",
                   "version 2 fail {\"rank\":0,\"role\":\"inference\",\"error\":\"lost a write\"}", "get 2",
                   "status"});
  Seed("controller_requests", "versions.txt", join(versions));
  Seed("controller_requests", "kv.txt",
       join({"kvset gloo/0 abc", "kvget gloo/0", "kvadd counter {\"delta\":1}", "kvadd counter {\"delta\":-3}",
             "kvget counter", "kvadd gloo/0 {\"delta\":1}", "wait 250", "status"}));
  Seed("controller_requests", "early_reports.txt",
       join({"version 1 start {\"rank\":0}", "heartbeat {\"role\":\"inference\",\"rank\":0}", "plan trainer 0",
             reg[0], "trainer {\"rank\":1,\"mesh_groups\":[]}", "get 1", "status"}));
}

// A state dir as a controller leaves it after a complete version.
void StateDir() {
  const std::string dir = (fs::temp_directory_path() / ("wsync-seeds-" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  controller::ControllerOptions o;
  o.trainers = 2;
  o.inference = 1;
  o.mapping = Must(ParseMappingSpecFromFile(Src("tests/cli/data/good/mapping.json")), "mapping");
  o.state_dir = dir;
  {
    auto c = Must(controller::Controller::Create(o), "controller");
    const json trainer = Must(ReadJsonFile(Src("tests/cli/data/good/trainer.json")), "trainer");
    const json inference = Must(ReadJsonFile(Src("tests/cli/data/good/inference.json")), "inference");
    for (const json& r : trainer["ranks"]) {
      json body = r;
      body["mesh_groups"] = trainer["mesh_groups"];
      Must(c->RegisterTrainer(body), "register trainer");
    }
    Must(c->RegisterInference(inference["ranks"][0]), "register inference");
    Must(c->StartVersion(1, 0), "start");
    Must(c->ReportDone(1, controller::Role::kTrainer, 0, true, ""), "done");
    Must(c->ReportDone(1, controller::Role::kTrainer, 1, true, ""), "done");
    Must(c->ReportDone(1, controller::Role::kInference, 0, true, ""), "done");
  }
  const std::string world = ReadText(dir + "/world.json");
  const std::string versions = ReadText(dir + "/versions.json");
  Seed("state_store", "world_and_versions", world + std::string(1, '\0') + versions);
  Seed("state_store", "world_only", world);
  fs::remove_all(dir);
}

// http_request: requests as agents and attackers send them; the first byte
// picks the size of the pieces the second feed uses.
void HttpRequests() {
  const std::string sig = "X-Wsync-Timestamp: 1800000000\r\nX-Wsync-Nonce: 00112233445566778899aabbccddeeff\r\n"
                          "X-Wsync-Content-Sha256: " + std::string(64, 'a') + "\r\nX-Wsync-Signature: " +
                          std::string(64, 'b') + "\r\n";
  Seed("http_request", "get_status", "\x05GET /v1/status?since=abc&wait_ms=100 HTTP/1.1\r\nHost: c\r\n" + sig + "\r\n");
  Seed("http_request", "post_length", "\x03POST /v1/heartbeat HTTP/1.1\r\nContent-Length: 27\r\n" + sig +
                                          "\r\n{\"role\":\"trainer\",\"rank\":0}");
  Seed("http_request", "put_chunked", "\x01PUT /v1/kv/a%2Fb HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                          "3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n");
  Seed("http_request", "pipelined", "\x07GET /healthz HTTP/1.1\r\n\r\nGET /metrics HTTP/1.0\r\n\r\n");
  Seed("http_request", "expect", "\x02POST /v1/register/inference HTTP/1.1\r\nExpect: 100-continue\r\n"
                                     "Content-Length: 2\r\n\r\n{}");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) Die("usage: fuzz_make_seeds SOURCE_DIR OUT_DIR");
  src_dir = argv[1];
  out_dir = argv[2];
  SpecsAndPlans();
  Descriptors();
  Deltas();
  ControllerScripts();
  StateDir();
  HttpRequests();
  std::printf("fuzz_make_seeds: %d seed files under %s\n", written, out_dir.c_str());
  return 0;
}
