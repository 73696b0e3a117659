// Per-rank plan slices (routing/rank_plan.h): the "plan" member of the
// controller's GET /v1/plan answer, which trainer and inference agents parse
// with ParseTrainerRankPlan / ParseInferenceRankPlan. The input is tried as
// both; a slice that parses must survive its own writer.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "routing/rank_plan.h"

using namespace wsync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // the client refuses a non-JSON answer before this parser
  StatusOr<TrainerRankPlan> trainer = ParseTrainerRankPlan(j);
  fuzz::CheckError(trainer.status(), "ParseTrainerRankPlan");
  if (trainer.ok()) {
    const nlohmann::json written = ToJson(*trainer);
    StatusOr<TrainerRankPlan> again = ParseTrainerRankPlan(written);
    if (!again.ok()) fuzz::Broken("a trainer slice does not parse again: " + again.status().message());
    if (ToJson(*again) != written) fuzz::Broken("trainer slice changes on a round trip");
  }
  StatusOr<InferenceRankPlan> inference = ParseInferenceRankPlan(j);
  fuzz::CheckError(inference.status(), "ParseInferenceRankPlan");
  if (inference.ok()) {
    const nlohmann::json written = ToJson(*inference);
    StatusOr<InferenceRankPlan> again = ParseInferenceRankPlan(written);
    if (!again.ok()) fuzz::Broken("an inference slice does not parse again: " + again.status().message());
    if (ToJson(*again) != written) fuzz::Broken("inference slice changes on a round trip");
  }
  return 0;
}
