// Text form of a transport MemoryDescriptor for JSON documents; the one
// implementation is MemoryDescriptor::ToText/FromText (transport/engine.h).
// These names stay for the inference agent's callers.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/engine.h"

namespace wsync::inference {

inline std::string DescriptorToText(const transport::MemoryDescriptor& d) { return d.ToText(); }

inline StatusOr<transport::MemoryDescriptor> DescriptorFromText(std::string_view text) {
  return transport::MemoryDescriptor::FromText(text);
}

}  // namespace wsync::inference
