// wsync.inference/v1 files and documents (routing/spec_io.h): what `wsync
// plan` and `wsync inference-agent --layout` read, and what the controller
// parses from inference registrations. A spec that parses must write back
// to JSON that parses to the same document.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "routing/spec_io.h"

using namespace wsync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::InputFile("inference.json", fuzz::Bytes(data, size));
  StatusOr<InferenceSpec> spec = ParseInferenceSpecFromFile(path);
  fuzz::CheckError(spec.status(), "ParseInferenceSpecFromFile");
  if (!spec.ok()) return 0;
  const nlohmann::json written = ToJson(*spec);
  StatusOr<InferenceSpec> again = ParseInferenceSpec(written, "round trip");
  if (!again.ok()) fuzz::Broken("a parsed inference spec does not parse again: " + again.status().message());
  if (ToJson(*again) != written) fuzz::Broken("inference spec changes on a round trip");
  return 0;
}
