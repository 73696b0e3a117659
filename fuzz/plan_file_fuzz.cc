// wsync.plan/v1 files (routing/plan_io.h): what `wsync plan --out` and the
// controller's state dir (plan.json) hold, read back by PlanFromJson. A
// plan that reads must write back to the same document.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "routing/json_reader.h"
#include "routing/plan_io.h"

using namespace wsync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::InputFile("plan.json", fuzz::Bytes(data, size));
  StatusOr<nlohmann::json> j = ReadJsonFile(path);
  fuzz::CheckError(j.status(), "ReadJsonFile");
  if (!j.ok()) return 0;
  StatusOr<RoutingTable> table = PlanFromJson(*j, path);
  fuzz::CheckError(table.status(), "PlanFromJson");
  if (!table.ok()) return 0;
  const nlohmann::json written = PlanToJson(*table);
  StatusOr<RoutingTable> again = PlanFromJson(written, "round trip");
  if (!again.ok()) fuzz::Broken("a plan that reads does not read again: " + again.status().message());
  if (PlanToJson(*again) != written) fuzz::Broken("plan changes on a round trip");
  return 0;
}
