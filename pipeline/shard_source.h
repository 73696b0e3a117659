// Where the pipeline's copy stage reads a trainer rank's local shards from.
//
// On host, the trainer_agent's ShardView (shared memory exported by the
// trainer process) implements it; tests implement it over plain vectors.
// The executor (pipeline/executor.h) reads through it and calls ReadsDone
// once it will read no more of a version, which is when the trainer may
// modify its weights again.
#pragma once

#include <cstdint>
#include <string>

namespace wsync {

class ShardSource {
 public:
  virtual ~ShardSource() = default;
  // The local shard of `name` (row-major local box, trainer dtype) and its
  // size in bytes, or null when this rank holds no such tensor. The pointer
  // stays valid for the life of the source.
  virtual const uint8_t* Shard(const std::string& name, uint64_t* bytes) const = 0;
  // Every read of `version` is done.
  virtual void ReadsDone(uint64_t version) = 0;
};

}  // namespace wsync
