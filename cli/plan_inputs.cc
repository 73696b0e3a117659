#include "cli/plan_inputs.h"

#include <cstdio>
#include <filesystem>

#include "models/generate.h"
#include "routing/spec_io.h"

namespace wsync::cli {
namespace fs = std::filesystem;

void Progress::Step(const std::string& what) const {
  if (!quiet_) std::fprintf(stderr, "[%8.3f s] %s\n", Elapsed(), what.c_str());
}

double Progress::Elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

namespace {

StatusOr<PlanInputs> FromCluster(const std::string& cluster, const Progress& progress) {
  progress.Step("generating specs from " + cluster);
  StatusOr<GeneratedSpecs> gen = GenerateFromClusterFile(cluster);
  if (!gen.ok()) return gen.status();
  PlanInputs in;
  in.description = cluster + " (" + gen->family + ", generated from the published config)";
  in.trainer = std::move(gen->trainer);
  in.inference = std::move(gen->inference);
  in.mapping = std::move(gen->mapping);
  in.options.trainer_source = cluster + " (generated trainer spec)";
  in.options.inference_source = cluster + " (generated inference spec)";
  in.options.mapping_source = cluster + " (mapping)";
  progress.Step("generated " + std::to_string(in.trainer.ranks.size()) + " trainer ranks, " +
                std::to_string(in.inference.ranks.size()) + " inference ranks");
  return in;
}

StatusOr<PlanInputs> FromFiles(const std::string& trainer, const std::string& inference,
                               const std::string& mapping, const Progress& progress) {
  PlanInputs in;
  in.description = trainer + ", " + inference + ", " + mapping;
  progress.Step("loading " + trainer);
  WSYNC_ASSIGN_OR_RETURN(in.trainer, ParseTrainerSpecFromFile(trainer));
  progress.Step("loading " + inference);
  WSYNC_ASSIGN_OR_RETURN(in.inference, ParseInferenceSpecFromFile(inference));
  progress.Step("loading " + mapping);
  WSYNC_ASSIGN_OR_RETURN(in.mapping, ParseMappingSpecFromFile(mapping));
  in.options.trainer_source = trainer;
  in.options.inference_source = inference;
  in.options.mapping_source = mapping;
  in.options.validate = false;  // the parsers validated
  progress.Step("loaded and validated");
  return in;
}

}  // namespace

StatusOr<PlanInputs> LoadPlanInputs(const PlanSource& src, const Progress& progress) {
  if (!src.cluster.empty()) return FromCluster(src.cluster, progress);
  if (!src.trainer.empty() || !src.inference.empty() || !src.mapping.empty()) {
    if (src.trainer.empty() || src.inference.empty() || src.mapping.empty()) {
      return InvalidArgument("--trainer, --inference and --mapping go together: give all three");
    }
    return FromFiles(src.trainer, src.inference, src.mapping, progress);
  }
  if (src.dir.empty()) {
    return InvalidArgument("nothing to plan: give an example folder (e.g. examples/kimi-k2-256x128), "
                           "--cluster FILE, or --trainer/--inference/--mapping FILEs");
  }
  const fs::path dir(src.dir);
  if (!fs::is_directory(dir)) {
    return NotFound(src.dir + ": no such folder (expected an example folder holding cluster.json, "
                    "or trainer.json + inference.json + mapping.json)");
  }
  if (fs::exists(dir / "cluster.json")) return FromCluster((dir / "cluster.json").string(), progress);
  const fs::path t = dir / "trainer.json", i = dir / "inference.json", m = dir / "mapping.json";
  if (fs::exists(t) && fs::exists(i) && fs::exists(m)) {
    return FromFiles(t.string(), i.string(), m.string(), progress);
  }
  return NotFound(src.dir + ": holds neither cluster.json nor trainer.json + inference.json + mapping.json");
}

}  // namespace wsync::cli
