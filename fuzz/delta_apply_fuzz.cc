// Delta payloads (delta/codec.h) as an inference agent reads them out of its
// inbox, where any trainer that can write may have put any bytes. The first
// input byte picks the element count of the target (and the element size
// follows from the header); the rest is the delta. A delta that Apply
// refuses must leave the target exactly as it was.
#include <cstring>
#include <vector>

#include "delta/codec.h"
#include "fuzz/fuzz_support.h"

using namespace wsync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint64_t elements = static_cast<uint64_t>(data[0]) * 613;  // up to ~2.4 chunks of 64 Ki elements
  const uint8_t* payload = data + 1;
  const uint64_t payload_bytes = size - 1;
  for (uint32_t elem : {1u, 2u, 4u}) {
    std::vector<uint8_t> target(elements * elem);
    for (size_t i = 0; i < target.size(); ++i) target[i] = static_cast<uint8_t>(i * 131 + 7);
    const std::vector<uint8_t> before = target;
    Status s = delta::Apply(payload, payload_bytes, target.data(), target.size(), "fuzz");
    fuzz::CheckError(s, "delta::Apply");
    if (!s.ok() && target != before) fuzz::Broken("a refused delta changed the target");
  }
  return 0;
}
