// The two kinds of agents that talk to the controller. Shared by the
// controller and its client.
#pragma once

#include <optional>
#include <string>

namespace wsync::controller {

enum class Role { kTrainer, kInference };

inline const char* RoleName(Role r) { return r == Role::kTrainer ? "trainer" : "inference"; }

// How a refused version start begins when the trainer's plan slice is of an
// older registration epoch than the controller's (an inference rank
// re-registered with new memory): the trainer fetches its slice again.
inline constexpr const char* kStaleEpochPrefix = "stale plan epoch";
// Beginning of the message that refuses (503) a version's start while an
// older version is still running; the trainer asks again.
inline constexpr const char* kOlderRunningPrefix = "an older version is still running";

inline std::optional<Role> ParseRole(const std::string& s) {
  if (s == "trainer") return Role::kTrainer;
  if (s == "inference") return Role::kInference;
  return std::nullopt;
}

}  // namespace wsync::controller
