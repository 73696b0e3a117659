// The controller's state dir (controller/state_store.h): world.json and
// versions.json, read back by a restarted `wsync controller --state-dir`.
// The input is world.json, then a NUL byte and versions.json (either may be
// absent). A damaged dir must end in one error from Controller::Create, and
// a restored plan must serve its slices.
#include <string>

#include "controller/controller.h"
#include "fuzz/fuzz_support.h"
#include "routing/spec_io.h"

using namespace wsync;
using namespace wsync::controller;

namespace {

const MappingSpec& Mapping() {
  static const MappingSpec m = [] {
    StatusOr<MappingSpec> s = ParseMappingSpecFromFile(fuzz::SourcePath("tests/cli/data/good/mapping.json"));
    if (!s.ok()) fuzz::Broken("cannot load tests/cli/data/good/mapping.json: " + s.status().message());
    return *s;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = fuzz::ScratchDir() + "/state";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  const std::string_view input = fuzz::Bytes(data, size);
  const size_t nul = input.find('\0');
  if (!input.empty()) fuzz::WriteFile(dir + "/world.json", input.substr(0, nul));
  if (nul != std::string_view::npos) fuzz::WriteFile(dir + "/versions.json", input.substr(nul + 1));

  ControllerOptions options;
  options.trainers = 2;
  options.inference = 1;
  options.mapping = Mapping();
  options.state_dir = dir;
  options.heartbeat_timeout_s = 0;
  StatusOr<std::unique_ptr<Controller>> c = Controller::Create(options);
  fuzz::CheckError(c.status(), "Controller::Create");
  if (!c.ok()) return 0;
  for (int32_t rank = 0; rank < 2; ++rank) {
    StatusOr<nlohmann::json> slice = (*c)->PlanSlice(Role::kTrainer, rank, std::chrono::milliseconds(0));
    fuzz::CheckError(slice.status(), "PlanSlice");
  }
  StatusOr<nlohmann::json> slice = (*c)->PlanSlice(Role::kInference, 0, std::chrono::milliseconds(0));
  fuzz::CheckError(slice.status(), "PlanSlice");
  (void)(*c)->StatusJson().dump();
  return 0;
}
