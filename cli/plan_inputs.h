// Resolves what `wsync plan` and `wsync bench plan` were pointed at (an
// example folder, three spec files, or a model + cluster spec) into validated
// metadata, ready for the planner. Reports progress to stderr.
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"
#include "routing/metadata.h"
#include "routing/planner.h"

namespace wsync::cli {

struct PlanSource {
  std::string dir;        // example folder: cluster.json, or trainer/inference/mapping.json
  std::string trainer;    // wsync.trainer/v1 file
  std::string inference;  // wsync.inference/v1 file
  std::string mapping;    // wsync.mapping/v1 file
  std::string cluster;    // wsync.cluster/v1 file (names the model config)
};

struct PlanInputs {
  std::string description;  // e.g. "examples/kimi-k2-256x128/cluster.json (generated)"
  TrainerSpec trainer;
  InferenceSpec inference;
  MappingSpec mapping;
  PlanOptions options;  // source names for error lines; skips re-validating parsed files
};

// Stage timer that prints "[  0.123 s] what" lines to stderr unless quiet.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), start_(std::chrono::steady_clock::now()) {}
  void Step(const std::string& what) const;
  double Elapsed() const;

 private:
  bool quiet_;
  std::chrono::steady_clock::time_point start_;
};

StatusOr<PlanInputs> LoadPlanInputs(const PlanSource& source, const Progress& progress);

}  // namespace wsync::cli
