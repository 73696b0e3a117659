// wsync.mapping/v1 files (configs/mappings/*.json, `--mapping`), read with a
// model config for "{name}" placeholders as `wsync plan` and `wsync
// controller` do. A mapping that parses must round-trip, and planning the
// tiny fixture world with it must end in a table or one error, never a crash.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "routing/json_reader.h"
#include "routing/planner.h"
#include "routing/spec_io.h"

using namespace wsync;

namespace {

struct Fixture {
  nlohmann::json config;
  TrainerSpec trainer;
  InferenceSpec inference;
};

const Fixture& World() {
  static const Fixture f = [] {
    Fixture w;
    StatusOr<nlohmann::json> config = ReadJsonFile(fuzz::SourcePath("tests/routing/data/tiny_config.json"));
    StatusOr<TrainerSpec> t = ParseTrainerSpecFromFile(fuzz::SourcePath("tests/routing/data/tiny_trainer.json"));
    StatusOr<InferenceSpec> i =
        ParseInferenceSpecFromFile(fuzz::SourcePath("tests/routing/data/tiny_inference.json"));
    if (!config.ok() || !t.ok() || !i.ok()) fuzz::Broken("cannot load the tiny fixture world");
    w.config = *config;
    w.trainer = *t;
    w.inference = *i;
    return w;
  }();
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& world = World();
  const std::string path = fuzz::InputFile("mapping.json", fuzz::Bytes(data, size));
  StatusOr<MappingSpec> mapping = ParseMappingSpecFromFile(path, &world.config);
  fuzz::CheckError(mapping.status(), "ParseMappingSpecFromFile");
  if (!mapping.ok()) return 0;
  const nlohmann::json written = ToJson(*mapping);
  StatusOr<MappingSpec> again = ParseMappingSpec(written, "round trip");
  if (!again.ok()) fuzz::Broken("a parsed mapping does not parse again: " + again.status().message());
  if (ToJson(*again) != written) fuzz::Broken("mapping changes on a round trip");
  StatusOr<RoutingTable> table = Plan(world.trainer, world.inference, *mapping);
  fuzz::CheckError(table.status(), "Plan");
  return 0;
}
