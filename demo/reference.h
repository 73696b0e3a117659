// The independent reference for what an inference rank must hold after a
// version: full synthetic weights -> fuse (as the mapping rule says) ->
// quantize (fp8 reference kernel) -> slice (tensor-parallel / expert range).
//
// Deliberately shares nothing with the planner or the trainer pipeline: it
// reads the mapping rule and evaluates it on whole tensors, the simple way.
// Used by the demo and the integration tests to check every byte.
//
// The synthetic values come from SyntheticBf16, the definition, element by
// element (not the fake trainer's FillSyntheticBox); fp8 blocks are
// quantized by a plain encoder of its own (not pipeline/fp8.cc, which the
// pipeline runs). An expert is generated on its own (never the whole
// stacked tensor once per expert), and every rank's cut of one engine
// tensor comes from a single fused, quantized copy.
#pragma once

#include <cstdint>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "routing/metadata.h"

namespace wsync::demo {

struct ExpectedTensor {
  std::vector<uint8_t> weight;  // local shape, row-major, destination dtype
  std::vector<uint8_t> scale;   // fp32 block scales (fp8 destinations only)
};

class Reference {
 public:
  // `trainer` supplies source tensor shapes (any rank's entry will do);
  // `drift`: the synthetic weights' drift period (demo/synthetic.h).
  Reference(const TrainerSpec& trainer, const MappingSpec& mapping, uint32_t drift = 1);

  StatusOr<ExpectedTensor> Expected(const InferenceTensor& tensor, uint64_t version) const;

  // The same engine tensor (one name, dtype and expert range) as several
  // ranks hold it: fused and quantized once, then cut for each rank, in the
  // order given.
  StatusOr<std::vector<ExpectedTensor>> ExpectedOnRanks(const std::vector<const InferenceTensor*>& tensors,
                                                        uint64_t version) const;

 private:
  struct Unsliced;  // fused (and quantized) whole engine tensor; reference.cc
  StatusOr<Unsliced> Build(const InferenceTensor& tensor, uint64_t version) const;
  StatusOr<ExpectedTensor> Cut(const Unsliced& whole, const InferenceTensor& tensor) const;

  struct SourceInfo {
    Shape shape;
    DType dtype;
  };
  // A rule's engine pattern as a regex and the names of its {Name} groups.
  struct EnginePattern {
    std::regex re;
    std::vector<std::string> names;
  };
  static EnginePattern CompilePattern(const std::string& pattern);
  std::unordered_map<std::string, SourceInfo> sources_;
  const MappingSpec& mapping_;
  uint32_t drift_ = 1;
  // One per mapping rule, compiled here and only matched by Expected(): it
  // runs on several threads at once, and compiling a std::regex writes the
  // shared ctype<char> facet's lazy narrow() cache (a data race, TSan).
  std::vector<EnginePattern> patterns_;
};

}  // namespace wsync::demo
