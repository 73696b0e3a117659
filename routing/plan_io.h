// RoutingTable -> wsync.plan/v1 JSON (docs/SCHEMA.md), and back.
//
// Used by `wsync plan --out` and the controller (which persists the plan).
// Ops are compact arrays because a full-scale plan has hundreds of thousands.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "routing/routing_table.h"

namespace wsync {

nlohmann::json PlanToJson(const RoutingTable& table);
// PlanToJson(table).dump(), byte for byte, without building the JSON tree of
// the ops (a tree of 12 M ops held ~10 GB and took ~40 s in the controller).
std::string PlanToText(const RoutingTable& table);

// Inverse of PlanToJson (holders are not stored and come back empty).
StatusOr<RoutingTable> PlanFromJson(const nlohmann::json& j, const std::string& source);

// Writes the plan compactly through a temp file + rename: a reader never sees
// a half-written plan.
Status WritePlanFile(const RoutingTable& table, const std::string& path);

}  // namespace wsync
