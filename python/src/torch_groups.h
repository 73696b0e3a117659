// The executor's collectives over torch.distributed process groups, for the
// in-process trainer route.
//
// wsync.TrainerAgent makes process groups of its own (dist.new_group, every
// rank alike, at construction: python/wsync/_trainer.py), one per rank set
// the plan can ask for, so the pipeline's all-gathers and barriers run on
// communicators the training loop never uses: they cannot interleave with
// the trainer's own collectives. The executor asks for groups by global
// ranks in chunk order; the factory finds the process group of that rank
// set and maps chunk order onto the group's own rank order.
//
// Threads: the pipeline thread calls these while the trainer keeps using its
// own groups; torch's process groups allow that. A failed collective leaves
// the process group as it is (a dead peer ends a torch job anyway), so
// groups joined again after a failure reuse it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "pipeline/group.h"

namespace wsync::python {

struct TorchProcessGroup {
  std::vector<int32_t> ranks;  // global rank of group rank i (dist.get_process_group_ranks)
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

// `timeout` bounds every collective's wait.
// `cuda_device` >= 0: the executor's buffers are on that CUDA device (the
// groups are then NCCL's, or any torch backend that takes CUDA tensors).
std::unique_ptr<GroupFactory> MakeTorchGroupFactory(std::vector<TorchProcessGroup> groups,
                                                    std::chrono::milliseconds timeout, int cuda_device = -1);

}  // namespace wsync::python
