// The two per-rank builders behind GenerateSpecs, and the torch.chunk rule
// they share. Internal to models/.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/status.h"
#include "models/cluster_spec.h"
#include "models/model_config.h"
#include "routing/metadata.h"

namespace wsync {

struct ChunkPiece {
  int64_t offset = 0;
  int64_t size = 0;
};

// Piece `index` of `count` of a length-n dim, exactly as torch.chunk (and so
// DTensor Shard and FSDP2) cut it: chunk size ceil(n/count), the last chunk
// shorter, trailing chunks empty.
inline ChunkPiece TorchChunk(int64_t n, int64_t count, int64_t index) {
  const int64_t step = (n + count - 1) / count;
  const int64_t begin = std::min(index * step, n);
  const int64_t end = std::min(begin + step, n);
  return {begin, end - begin};
}

// Trainer ranks, meshes and MeshGroups for FSDP x PP x EP; see trainer_gen.cc.
Status BuildTrainerSpec(const ModelDims& dims, const TrainerLayout& layout,
                        TrainerSpec* out);

// Inference ranks with vLLM layouts and one packed region each; see
// inference_gen.cc.
Status BuildInferenceSpec(const ModelDims& dims, const InferenceLayout& layout,
                          InferenceSpec* out);

}  // namespace wsync
