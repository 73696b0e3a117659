#include "demo/netns_cluster.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace wsync::demo {
namespace {

// Runs a shell command; returns its exit status and fills `output` with
// stdout+stderr (for error messages).
int Run(const std::string& cmd, std::string* output = nullptr) {
  std::string out;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[512];
  while (fgets(buf, sizeof buf, f) != nullptr) out += buf;
  const int rc = pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (output != nullptr) *output = out;
  return rc;
}

Status Must(const std::string& cmd) {
  std::string out;
  if (Run(cmd, &out) != 0) return Internal("emulated cluster: `" + cmd + "` failed: " + out);
  return Status::Ok();
}

uint64_t ReadCounter(const std::string& netns, const std::string& what) {
  std::string out;
  if (Run("ip netns exec " + netns + " cat /sys/class/net/eth0/statistics/" + what, &out) != 0) return 0;
  return std::strtoull(out.c_str(), nullptr, 10);
}

}  // namespace

StatusOr<std::unique_ptr<EmulatedCluster>> EmulatedCluster::Create(const EmulatedClusterOptions& options) {
  if (geteuid() != 0) return Unavailable("emulated cluster: needs root to create network namespaces");
  if (Run("command -v ip") != 0) return Unavailable("emulated cluster: iproute2 `ip` is not installed");
  if (options.rate_gbit > 0 && Run("command -v tc") != 0) {
    return Unavailable("emulated cluster: `tc` (iproute2) is not installed; needed to cap links");
  }
  if (options.hosts < 1 || options.hosts > 250) return InvalidArgument("emulated cluster: hosts must be 1..250");
  std::unique_ptr<EmulatedCluster> cluster(new EmulatedCluster(options));
  Status s = cluster->Build();
  if (!s.ok()) return s;  // the destructor removes what was made
  return cluster;
}

Status EmulatedCluster::Build() {
  const std::string pid = std::to_string(getpid());
  prefix_ = "wsync-" + pid;
  link_prefix_ = "ws" + pid;  // + "s12"/"h12"/"r"/"u": <= 15 chars for pids up to 7 digits
  subnet_ = "198.18." + std::to_string(1 + getpid() % 250) + ".";
  switch_ = prefix_ + "-sw";
  // The first namespace tells whether this machine lets us make any (a
  // container without CAP_NET_ADMIN does not): Unavailable. Any later
  // failure is a broken cluster, an error.
  if (Status s = Must("ip netns add " + switch_); !s.ok()) {
    return Unavailable("emulated cluster: cannot create network namespaces here (" + s.message() + ")");
  }
  made_netns_.push_back(switch_);
  const std::string sw = "ip -n " + switch_ + " ";
  WSYNC_RETURN_IF_ERROR(Must(sw + "link set lo up"));
  WSYNC_RETURN_IF_ERROR(Must(sw + "link add br0 type bridge"));
  WSYNC_RETURN_IF_ERROR(Must(sw + "addr add " + switch_address() + "/24 dev br0"));
  WSYNC_RETURN_IF_ERROR(Must(sw + "link set br0 up"));

  // Uplink from this process's namespace (uncapped: control traffic only).
  const std::string up_root = link_prefix_ + "r", up_sw = link_prefix_ + "u";
  WSYNC_RETURN_IF_ERROR(Must("ip link add " + up_root + " type veth peer name " + up_sw));
  made_uplink_ = true;
  WSYNC_RETURN_IF_ERROR(Must("ip link set " + up_sw + " netns " + switch_));
  WSYNC_RETURN_IF_ERROR(Must(sw + "link set " + up_sw + " master br0"));
  WSYNC_RETURN_IF_ERROR(Must(sw + "link set " + up_sw + " up"));
  WSYNC_RETURN_IF_ERROR(Must("ip addr add " + uplink_address() + "/24 dev " + up_root));
  WSYNC_RETURN_IF_ERROR(Must("ip link set " + up_root + " up"));

  for (int k = 0; k < options_.hosts; ++k) {
    const std::string ns = prefix_ + "-h" + std::to_string(k);
    WSYNC_RETURN_IF_ERROR(Must("ip netns add " + ns));
    made_netns_.push_back(ns);
    hosts_.push_back(ns);
    const std::string host_if = link_prefix_ + "h" + std::to_string(k);
    const std::string sw_if = link_prefix_ + "s" + std::to_string(k);
    // Created in the host namespace, so nothing lingers in ours on failure.
    WSYNC_RETURN_IF_ERROR(Must("ip -n " + ns + " link add " + host_if + " type veth peer name " + sw_if +
                               " netns " + switch_));
    WSYNC_RETURN_IF_ERROR(Must("ip -n " + ns + " link set " + host_if + " name eth0"));
    WSYNC_RETURN_IF_ERROR(Must("ip -n " + ns + " addr add " + host_address(k) + "/24 dev eth0"));
    WSYNC_RETURN_IF_ERROR(Must("ip -n " + ns + " link set eth0 up"));
    WSYNC_RETURN_IF_ERROR(Must("ip -n " + ns + " link set lo up"));
    WSYNC_RETURN_IF_ERROR(Must(sw + "link set " + sw_if + " master br0"));
    WSYNC_RETURN_IF_ERROR(Must(sw + "link set " + sw_if + " up"));
    if (options_.rate_gbit > 0) {
      WSYNC_RETURN_IF_ERROR(Cap(ns, "eth0"));       // host egress
      WSYNC_RETURN_IF_ERROR(Cap(switch_, sw_if));   // host ingress
    }
  }
  // The bridge has STP off, so its ports forward as soon as they are up.
  return Status::Ok();
}

Status EmulatedCluster::Cap(const std::string& netns, const std::string& dev) const {
  // burst: a few ms of line rate (at least 256 KiB) so the kernel timer
  // granularity does not cut the rate; latency bounds the queue.
  const double bytes_per_s = options_.rate_gbit * 1e9 / 8;
  const uint64_t burst = std::max<uint64_t>(256 << 10, static_cast<uint64_t>(bytes_per_s * 0.002));
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.0fkbit", options_.rate_gbit * 1e6);
  std::string out;
  const std::string cmd = "ip netns exec " + netns + " tc qdisc add dev " + dev + " root tbf rate " + rate +
                          " burst " + std::to_string(burst) + " latency 50ms";
  if (Run(cmd, &out) != 0) {
    return Unavailable("emulated cluster: cannot cap links with tbf (`" + cmd + "`: " + out +
                       "); is the sch_tbf kernel module available?");
  }
  return Status::Ok();
}

uint64_t EmulatedCluster::HostTxBytes(int k) const { return ReadCounter(hosts_[k], "tx_bytes"); }
uint64_t EmulatedCluster::HostRxBytes(int k) const { return ReadCounter(hosts_[k], "rx_bytes"); }

EmulatedCluster::~EmulatedCluster() {
  // Deleting a namespace deletes the veth ends in it, and with them their peers.
  for (auto it = made_netns_.rbegin(); it != made_netns_.rend(); ++it) Run("ip netns del " + *it);
  if (made_uplink_) Run("ip link del " + link_prefix_ + "r 2>/dev/null; true");
}

}  // namespace wsync::demo
