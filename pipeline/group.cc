#include "pipeline/group.h"

#include <algorithm>

namespace wsync {

ChunkRange TorchChunk(int64_t n, int64_t parts, int64_t index) {
  const int64_t chunk = (n + parts - 1) / parts;
  const int64_t begin = std::min(n, chunk * index);
  const int64_t end = std::min(n, chunk * (index + 1));
  return {begin, end - begin};
}

}  // namespace wsync
