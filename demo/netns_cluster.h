// An emulated cluster on one machine: one network namespace per host, all
// joined to a "switch" namespace's bridge by veth pairs, each host link
// optionally capped in both directions with `tc ... tbf` so that the link,
// not the local CPU, bounds a transfer, as on a real cluster.
//
// Used by `wsync bench cluster` (capped hosts) and the netns integration test
// (uncapped, trainer and inference ranks in separate namespaces). Needs root,
// iproute2 (`ip`, `tc`) and the bridge/veth/tbf kernel support; Create says
// which is missing (Unavailable: root, the tools, or any namespace at all;
// Internal: a cluster that failed to build where namespaces can be made). Every namespace and link it made is deleted by the
// destructor, also when Create fails half way.
//
// Addresses: subnet 198.18.S.0/24 (S from the pid, so two clusters of two
// processes do not collide): host k is .k+1 on its `eth0`, the switch's
// bridge is .254 (run the controller there), and this process's own
// namespace gets .253 on an uncapped uplink so it can reach the switch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace wsync::demo {

struct EmulatedClusterOptions {
  int hosts = 2;
  double rate_gbit = 0;  // per host link, each direction; 0: uncapped
};

class EmulatedCluster {
 public:
  ~EmulatedCluster();
  EmulatedCluster(const EmulatedCluster&) = delete;
  EmulatedCluster& operator=(const EmulatedCluster&) = delete;

  // Unavailable (naming what is missing) without root, `ip`, `tc` or tbf.
  static StatusOr<std::unique_ptr<EmulatedCluster>> Create(const EmulatedClusterOptions& options);

  int hosts() const { return static_cast<int>(hosts_.size()); }
  const std::string& host_netns(int k) const { return hosts_[k]; }
  std::string host_address(int k) const { return subnet_ + std::to_string(k + 1); }
  const std::string& switch_netns() const { return switch_; }
  std::string switch_address() const { return subnet_ + "254"; }
  // This process's address on the uplink to the switch.
  std::string uplink_address() const { return subnet_ + "253"; }
  double rate_gbit() const { return options_.rate_gbit; }
  // Bytes host k's eth0 has sent / received so far (from /sys).
  uint64_t HostTxBytes(int k) const;
  uint64_t HostRxBytes(int k) const;

 private:
  explicit EmulatedCluster(EmulatedClusterOptions options) : options_(options) {}
  Status Build();
  Status Cap(const std::string& netns, const std::string& dev) const;

  EmulatedClusterOptions options_;
  std::string prefix_;               // "wsync-<pid>"
  std::string link_prefix_;          // "ws<pid>" for interface names
  std::string subnet_;               // "198.18.S."
  std::string switch_;
  std::vector<std::string> hosts_;
  std::vector<std::string> made_netns_;  // to delete
  bool made_uplink_ = false;
};

}  // namespace wsync::demo
