// Topology discovery on fake sysfs trees (tests/dist/data/sysfs_*), the JSON form, the depth-first ring and
// the link-load cost model, including the 8-GPU dual-socket box whose ranks alternate between sockets.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/error_of.h"
#include "dist/comm/mesh.h"
#include "dist/comm/topology.h"
#include "dist/comm/topology_detect.h"
#include "tensor/check.h"
#include "tensor/cpu_share.h"

namespace cz::dist {
namespace {

const std::string kData = CZ_DIST_TEST_DATA;
const std::string kDualSocket = kData + "/sysfs_dual_socket_8gpu";
const std::string k4090 = kData + "/sysfs_4090_box";

// Ranks alternate between the sockets: even ranks on socket 0, odd ranks on socket 1.
const std::vector<std::string> kAlternating = {"0000:19:00.0", "0000:9a:00.0", "0000:1a:00.0",
                                               "0000:9b:00.0", "0000:3b:00.0", "0000:ba:00.0",
                                               "0000:3c:00.0", "0000:bb:00.0"};

DetectOptions options(const std::string& root) {
  DetectOptions o;
  o.sysfs_root = root;
  return o;
}

Topology dual_socket_from_sysfs() {
  std::vector<RankPlace> places;
  for (int r = 0; r < 8; ++r)
    places.push_back(locate_rank(r, "box", kAlternating[size_t(r)], options(kDualSocket)));
  return build_topology(places, options(kDualSocket));
}

std::vector<int> cpu_range(int first, int count) {
  std::vector<int> v;
  for (int c = first; c < first + count; ++c) v.push_back(c);
  return v;
}

std::vector<int> rank_order(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

const LinkLoad& load_of(const Topology& t, const std::vector<LinkLoad>& loads, const std::string& id) {
  const int i = t.find(id);
  EXPECT_GE(i, 0) << id;
  return loads.at(size_t(std::max(i, 0)));
}

// Note [A rank's CPUs on a node]: each GPU's CPUs from sysfs (local_cpulist, else its NUMA node's cpulist),
// and 8 unbound ranks on the 32 CPUs of this box each taking 4 on its own GPU's socket.
TEST(Sysfs, GpuLocalCpusPlaceUnboundRanksOnTheirGpusSocket) {
  EXPECT_EQ(pci_local_cpus(kDualSocket, "0000:ba:00.0"), cpu_range(16, 16));  // its local_cpulist
  EXPECT_EQ(pci_local_cpus(kDualSocket, "0000:19:00.0"), cpu_range(0, 16));   // node0's cpulist
  EXPECT_EQ(pci_local_cpus(kDualSocket, "0000:9a:00.0"), cpu_range(16, 16));  // node1's
  EXPECT_TRUE(pci_local_cpus(kDualSocket, "0000:ff:00.0").empty());           // no such device
  std::vector<RankCpus> ranks;
  for (int r = 0; r < 8; ++r)
    ranks.push_back({cpu_range(0, 32), pci_local_cpus(kDualSocket, kAlternating[size_t(r)])});
  const std::vector<CpuShare> shares = share_node_cpus(ranks);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(shares[size_t(r)].cpus.size(), 4u) << r;
    EXPECT_EQ(shares[size_t(r)].near, 4) << r;  // even ranks on socket 0, odd ones on socket 1
    EXPECT_EQ(thread_cpus(shares[size_t(r)], ranks[size_t(r)].near).launcher, shares[size_t(r)].cpus.front());
  }
  EXPECT_EQ(shares[1].cpus, cpu_range(16, 4));
  EXPECT_EQ(shares[2].cpus, cpu_range(4, 4));
}

TEST(Sysfs, ReadsLinkSpeedsBusIdsAndNuma) {
  EXPECT_DOUBLE_EQ(pcie_lane_gbps("16.0 GT/s PCIe"), 1.969);
  EXPECT_DOUBLE_EQ(pcie_lane_gbps("8 GT/s"), 0.985);
  EXPECT_DOUBLE_EQ(pcie_lane_gbps("2.5 GT/s PCIe"), 0.25);
  EXPECT_EQ(pcie_lane_gbps("Unknown"), 0.0);
  EXPECT_EQ(normalize_busid("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normalize_busid("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_NEAR(pci_link_gbps(kDualSocket, "0000:19:00.0"), 31.5, 0.01);
  EXPECT_EQ(pci_link_gbps(kDualSocket, "0000:ff:00.0"), 0.0);
  EXPECT_EQ(pci_numa_node(kDualSocket, "0000:9a:00.0"), 1);
  EXPECT_EQ(pci_numa_node(k4090, "0000:01:00.0"), 0);  // -1 in sysfs: one node
  EXPECT_EQ(cpu_numa_node(kDualSocket, 20), 1);
  EXPECT_EQ(cpu_numa_node(kDualSocket, 3), 0);
  EXPECT_DOUBLE_EQ(network_gbps(kDualSocket), 12.5);
}

TEST(Sysfs, FollowsThePciChainToTheRootComplex) {
  EXPECT_EQ(pci_chain(kDualSocket, "0000:9B:00.0"),
            (std::vector<std::string>{"0000:97:02.0", "0000:98:00.0", "0000:99:01.0", "0000:9b:00.0"}));
  EXPECT_EQ(pci_chain(k4090, "0000:41:00.0"), (std::vector<std::string>{"0000:00:03.0", "0000:41:00.0"}));
  EXPECT_THROW(pci_chain(kDualSocket, "0000:ee:00.0"), IoError);
}

TEST(Topology, DualSocketBoxFromSysfs) {
  const Topology t = dual_socket_from_sysfs();
  EXPECT_EQ(t.num_ranks(), 8);
  int hosts = 0, cpus = 0, switches = 0, gpus = 0;
  for (const auto& n : t.nodes()) {
    hosts += n.type == "host";
    cpus += n.type == "cpu";
    switches += n.type == "switch";
    gpus += n.type == "gpu";
  }
  EXPECT_EQ(hosts, 1);
  EXPECT_EQ(cpus, 2);
  EXPECT_EQ(switches, 4);
  EXPECT_EQ(gpus, 8);
  // GPU of rank 1 hangs off a switch on socket 1.
  const TopoNode& g = t.nodes()[size_t(t.node_of_rank(1))];
  EXPECT_EQ(g.type, "gpu");
  const TopoNode& sw = t.nodes()[size_t(g.parent)];
  EXPECT_EQ(sw.type, "switch");
  EXPECT_EQ(t.nodes()[size_t(sw.parent)].id, "cpu1");
  EXPECT_NEAR(g.up_gbps, 31.5, 0.01);
  EXPECT_DOUBLE_EQ(t.nodes()[size_t(sw.parent)].up_gbps, 20.0);  // the socket link (DetectOptions default)
  EXPECT_DOUBLE_EQ(t.nodes()[size_t(t.find("host0"))].up_gbps, 12.5);
}

TEST(Topology, RingCrossesTheSocketLinkOncePerDirection) {
  const Topology t = dual_socket_from_sysfs();
  const std::vector<int> ring = t.ring_order();
  EXPECT_EQ(ring, (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  const auto loads = t.link_loads(ring);
  for (const auto& l : loads) {  // an Euler tour: at most one hop per link and direction
    EXPECT_LE(l.up, 1) << t.nodes()[size_t(l.node)].id;
    EXPECT_LE(l.down, 1) << t.nodes()[size_t(l.node)].id;
  }
  EXPECT_EQ(load_of(t, loads, "cpu0").up, 1);
  EXPECT_EQ(load_of(t, loads, "cpu0").down, 1);
  EXPECT_EQ(load_of(t, loads, "cpu1").up, 1);
  EXPECT_EQ(load_of(t, loads, "host0").up, 0);  // one host: the network is not used
  // Rank order crosses the socket link at every hop.
  const auto plain = t.link_loads(rank_order(8));
  EXPECT_EQ(load_of(t, plain, "cpu0").up, 4);
  EXPECT_EQ(load_of(t, plain, "cpu0").down, 4);
}

TEST(Topology, DepthFirstRingIsAtLeast3Point5TimesRankOrderOnTheDualSocketBox) {
  for (const Topology& t : {dual_socket_from_sysfs(), Topology::load(kData + "/dual_socket_8gpu.json")}) {
    const double bytes = 64.0 * 1024 * 1024;
    const RingPrediction best = t.predict(t.ring_order(), bytes);
    const RingPrediction plain = t.predict(rank_order(8), bytes);
    EXPECT_EQ(best.max_link_load, 1);
    EXPECT_EQ(plain.max_link_load, 4);
    EXPECT_GE(best.busbw_gbps / plain.busbw_gbps, 3.5) << best.busbw_gbps << " vs " << plain.busbw_gbps;
    EXPECT_NEAR(best.busbw_gbps, 20.0, 0.5);  // the socket link is the bottleneck
    EXPECT_NE(best.bottleneck.find("cpu"), std::string::npos) << best.bottleneck;
  }
}

TEST(Topology, CostModelMatchesHandComputation) {
  // Two GPUs on one switch: each hop loads both GPU links once per direction.
  const Topology t = Topology::from_json(nlohmann::json::parse(R"({"nodes": [
    {"id": "h", "type": "host", "up_gbps": 10}, {"id": "c", "type": "cpu", "parent": "h", "up_gbps": 20},
    {"id": "s", "type": "switch", "parent": "c", "up_gbps": 16},
    {"id": "a", "type": "gpu", "parent": "s", "up_gbps": 8, "rank": 0},
    {"id": "b", "type": "gpu", "parent": "s", "up_gbps": 8, "rank": 1}]})"));
  CostModel m;
  m.step_overhead_us = 10;
  m.link_latency_us = 1;
  const double bytes = 8e6;
  const RingPrediction p = t.predict({0, 1}, bytes, Collective::reduce_scatter, m);
  const double step = 4e6 / 8e9 + 12e-6;  // chunk over an 8 GB/s link, plus 10 us + 2 links x 1 us
  EXPECT_NEAR(p.time_s, step, 1e-12);
  EXPECT_NEAR(p.busbw_gbps, bytes / step / 1e9 / 2, 1e-9);
  const RingPrediction ar = t.predict({0, 1}, bytes, Collective::all_reduce, m);
  EXPECT_NEAR(ar.time_s, 2 * step, 1e-12);
  EXPECT_NEAR(ar.busbw_gbps, p.busbw_gbps, 1e-9);  // all-reduce moves twice the data in twice the time
}

TEST(Topology, TwoHostsCrossTheNetworkOncePerDirection) {
  const Topology t = Topology::load(kData + "/two_hosts_4gpu.json");
  EXPECT_EQ(t.ring_order(), (std::vector<int>{0, 2, 1, 3}));
  const auto loads = t.link_loads(t.ring_order());
  EXPECT_EQ(load_of(t, loads, "host0").up, 1);
  EXPECT_EQ(load_of(t, loads, "host0").down, 1);
  EXPECT_EQ(load_of(t, t.link_loads(rank_order(4)), "host0").up, 2);
}

// 2 hosts x 2 CPU ranks as detection builds them, with a network of `net_gbps` per host.
Topology two_hosts_of_cpu_ranks(double net_gbps) {
  std::vector<RankPlace> places;
  for (int r = 0; r < 4; ++r) {
    RankPlace p;
    p.rank = r;
    p.host = std::string(1, char('a' + r / 2));  // assigning a literal here trips GCC 12's -Wrestrict
    p.net_gbps = net_gbps;
    places.push_back(p);
  }
  return build_topology(places, DetectOptions{});
}

TEST(TwoLevel, DetectedHostsCarryTheirNameAndNetwork) {
  const Topology t = two_hosts_of_cpu_ranks(0.125);
  for (const auto& [id, host] : {std::pair{"host0", "a"}, std::pair{"host1", "b"}}) {
    const TopoNode& n = t.nodes().at(size_t(t.find(id)));
    EXPECT_EQ(n.type, "host");
    EXPECT_EQ(n.up_gbps, 0.125);
    EXPECT_EQ(n.extra.at("name"), host);
  }
  EXPECT_EQ(t.ring_order(), (std::vector<int>{0, 1, 2, 3}));
}

// Note [Two-level cost model], by hand: the cross rings put two hops on each host's network link.
TEST(TwoLevel, CostModelMatchesHandComputation) {
  const Topology t = two_hosts_of_cpu_ranks(0.125);
  CostModel m;
  m.step_overhead_us = 0;
  m.link_latency_us = 0;
  const double bytes = 4e6;
  const std::vector<std::vector<int>> hosts = {{0, 1}, {2, 3}};
  const TwoLevelPrediction p = t.predict_two_level(t.ring_order(), hosts, bytes, Collective::all_reduce, m);
  // Flat: 6 steps of a 1 MB chunk over one host-link hop. Hier: inside, 1 step of 2 MB over a 10 GB/s proc
  // link (reduce-scatter, then all-gather); across, 2 steps of 1 MB with two rings on the host link.
  EXPECT_NEAR(p.flat_s, 6 * 1e6 / 0.125e9, 1e-12);
  EXPECT_NEAR(p.hier_s, 2 * 2e6 / 10e9 + 2 * 2 * 1e6 / 0.125e9, 1e-12);
  EXPECT_TRUE(p.hier_faster());
  EXPECT_EQ(p.reason.rfind("hier: predicted", 0), 0u) << p.reason;
  const auto loads = t.link_loads(t.ring_order());
  EXPECT_EQ(load_of(t, loads, "host0").up, 1);
}

TEST(TwoLevel, HierWinsOnSlowNetworksAndForSmallCalls) {
  constexpr double kLarge = 64 << 20, kSmall = 1024;
  const std::vector<std::vector<int>> hosts = {{0, 1}, {2, 3}};
  for (Collective k : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather}) {
    SCOPED_TRACE(std::string(name(k)));
    const Topology slow = two_hosts_of_cpu_ranks(0.125), fast = two_hosts_of_cpu_ranks(12.5);
    EXPECT_TRUE(slow.predict_two_level(slow.ring_order(), hosts, kLarge, k).hier_faster());
    // A fast network: the flat ring moves large buffers over the slowest link (a rank's own, 10 GB/s) with
    // fewer passes over it than two levels do.
    EXPECT_FALSE(fast.predict_two_level(fast.ring_order(), hosts, kLarge, k).hier_faster());
    // Small calls pay latency per step: 2(H-1) + 2(R-1) steps against 2(HR-1).
    EXPECT_TRUE(fast.predict_two_level(fast.ring_order(), hosts, kSmall, k).hier_faster());
  }
}

TEST(Topology, GpusOnRootPortsHangOffTheCpu) {
  std::vector<RankPlace> places;
  const std::vector<std::string> bus = {"0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0",
                                        "0000:82:00.0"};
  for (int r = 0; r < 5; ++r) places.push_back(locate_rank(r, "rtx", bus[size_t(r)], options(k4090)));
  const Topology t = build_topology(places, options(k4090));
  for (int r = 0; r < 4; ++r) {
    const TopoNode& g = t.nodes()[size_t(t.node_of_rank(r))];
    EXPECT_EQ(t.nodes()[size_t(g.parent)].type, "cpu") << r;
    EXPECT_NEAR(g.up_gbps, 31.5, 0.01);
  }
  // The fifth sits behind one bridge, modelled as a switch, on a PCIe 3.0 x8 link.
  const TopoNode& g5 = t.nodes()[size_t(t.node_of_rank(4))];
  EXPECT_EQ(t.nodes()[size_t(g5.parent)].type, "switch");
  EXPECT_NEAR(g5.up_gbps, 7.88, 0.01);
  EXPECT_DOUBLE_EQ(t.nodes()[size_t(t.find("host0"))].up_gbps, 1.25);  // a 10 Gb/s NIC
}

TEST(Topology, CpuRanksAndSharedGpus) {
  std::vector<RankPlace> places;
  places.push_back(locate_rank(0, "a", "", options(kDualSocket)));
  places.push_back(locate_rank(1, "a", "", options(kDualSocket)));
  places.push_back(locate_rank(2, "a", "0000:19:00.0", options(kDualSocket)));
  places.push_back(locate_rank(3, "a", "0000:19:00.0", options(kDualSocket)));
  const Topology t = build_topology(places, options(kDualSocket));
  EXPECT_EQ(t.nodes()[size_t(t.node_of_rank(0))].type, "proc");
  EXPECT_EQ(t.node_of_rank(2), t.node_of_rank(3));  // two ranks staging through one GPU
  const auto ring = t.ring_order();
  EXPECT_EQ(ring.size(), 4u);
  const auto j = t.to_json();
  bool shared = false;
  for (const auto& n : j["nodes"]) shared |= n.contains("ranks") && n["ranks"].size() == 2;
  EXPECT_TRUE(shared);
}

TEST(Topology, JsonRoundTripKeepsEverything) {
  const Topology t = dual_socket_from_sysfs();
  const Topology u = Topology::from_json(nlohmann::json::parse(t.to_json_string()));
  EXPECT_EQ(t.to_json().dump(), u.to_json().dump());
  EXPECT_EQ(u.ring_order(), t.ring_order());
  // Extra fields survive.
  EXPECT_NE(t.to_json_string().find("\"busid\":\"0000:19:00.0\""), std::string::npos);
}

TEST(Topology, RejectsMalformedJson) {
  auto parse = [](const char* s) { return Topology::from_json(nlohmann::json::parse(s)); };
  EXPECT_THROW(parse(R"({"node": []})"), ValueError);
  EXPECT_THROW(parse(R"({"nodes": [{"id": "a", "type": "gpu", "parent": "x", "rank": 0}]})"), ValueError);
  EXPECT_THROW(parse(R"({"nodes": [{"id": "a", "rank": 0}, {"id": "a", "rank": 1}]})"), ValueError);
  EXPECT_THROW(parse(R"({"nodes": [{"id": "a", "rank": 0}, {"id": "b", "rank": 0}]})"), ValueError);
  EXPECT_THROW(parse(R"({"nodes": [{"id": "a", "rank": 0}, {"id": "b", "rank": 2}]})"), ValueError);
  EXPECT_THROW(parse(R"({"nodes": [{"id": "a", "parent": "b"}, {"id": "b", "parent": "a", "rank": 0}]})"),
               ValueError);
  EXPECT_THROW(parse(R"({"nodes": [{"id": "a", "up_gbps": -1, "rank": 0}]})"), ValueError);
  EXPECT_THROW(Topology::load(kData + "/missing.json"), IoError);
  // A used link without a bandwidth cannot be predicted.
  const Topology t = parse(R"({"nodes": [{"id": "h"}, {"id": "a", "parent": "h", "rank": 0},
                                          {"id": "b", "parent": "h", "rank": 1}]})");
  EXPECT_THROW(t.predict({0, 1}, 1e6), ValueError);
}

// Note [2-D mesh]: hosts in the order of their lowest rank, shard groups by host or by size, replication
// groups across them, and errors that name the flag.
TEST(Mesh, HostsShardAndReplicationGroups) {
  const HostMap m = HostMap::of({"b", "b", "a", "a", "b", "a"});
  EXPECT_EQ(m.hosts, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(m.ranks, (std::vector<std::vector<int>>{{0, 1, 4}, {2, 3, 5}}));
  EXPECT_EQ(m.local_index, (std::vector<int>{0, 1, 0, 1, 2, 2}));
  EXPECT_EQ(m.ranks_per_host(), 3);
  EXPECT_EQ(shard_groups("host", m), m.ranks);
  EXPECT_EQ(replicate_groups(m.ranks), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 5}}));
  EXPECT_EQ(shard_groups("world", m), (std::vector<std::vector<int>>{{0, 1, 2, 3, 4, 5}}));
  EXPECT_EQ(shard_groups("2", m), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(replicate_groups(shard_groups("3", m)), (std::vector<std::vector<int>>{{0, 3}, {1, 4}, {2, 5}}));
  EXPECT_HAS(error_of<ValueError>([&] { shard_groups("4", m); }),
             "--shard-group 4 does not divide the 6 ranks");
  EXPECT_HAS(error_of<ValueError>([&] { shard_groups("hosts", m); }), "got 'hosts'");
  const HostMap uneven = HostMap::of({"a", "a", "b"});
  EXPECT_EQ(uneven.ranks_per_host(), 0);
  EXPECT_HAS(error_of<ValueError>([&] { shard_groups("host", uneven); }), "2 on a, 1 on b");
}

}  // namespace
}  // namespace cz::dist
