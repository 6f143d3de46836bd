// Topology discovery from sysfs (and the CUDA runtime for bus ids and P2P), gathered across ranks.
#include "dist/comm/topology_detect.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "dist/comm/bootstrap.h"
#include "dist/comm/mpi_util.h"
#include "tensor/check.h"
#include "tensor/cpu_share.h"
#if CZ_WITH_CUDA
#include "dist/comm/cuda/cuda_check.h"
#endif

namespace fs = std::filesystem;

namespace cz::dist {
namespace {

constexpr double kDefaultPcieGbps = 24;  // PCIe 4.0 x16, when sysfs has no link figures (VMs)

std::string read_line(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  if (f) std::getline(f, s);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

bool is_busid(const std::string& s) {
  static const std::regex re("[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]");
  return std::regex_match(s, re);
}

bool in_cpulist(const std::string& list, int cpu) {  // "0-3,8-11"
  const std::vector<int> cpus = parse_cpu_list(list);
  return std::binary_search(cpus.begin(), cpus.end(), cpu);
}

nlohmann::json place_to_json(const RankPlace& p) {
  nlohmann::json chain = nlohmann::json::array();
  for (const auto& h : p.chain) chain.push_back({{"busid", h.busid}, {"up_gbps", h.up_gbps}});
  return {{"rank", p.rank},     {"host", p.host},     {"numa", p.numa}, {"net_gbps", p.net_gbps},
          {"gpu", p.gpu_busid}, {"name", p.gpu_name}, {"chain", chain}, {"p2p", p.p2p}};
}

RankPlace place_from_json(const nlohmann::json& j) {
  RankPlace p;
  p.rank = j.at("rank").get<int>();
  p.host = j.at("host").get<std::string>();
  p.numa = j.at("numa").get<int>();
  p.net_gbps = j.at("net_gbps").get<double>();
  p.gpu_busid = j.at("gpu").get<std::string>();
  p.gpu_name = j.at("name").get<std::string>();
  p.p2p = j.at("p2p").get<int>();
  for (const auto& h : j.at("chain"))
    p.chain.push_back({h.at("busid").get<std::string>(), h.at("up_gbps").get<double>()});
  return p;
}

}  // namespace

std::string sysfs_root(const DetectOptions& options) {
  const char* env = std::getenv("CZ_SYSFS_ROOT");
  return env && *env ? std::string(env) : options.sysfs_root;
}

std::string normalize_busid(const std::string& busid) {
  std::string s = busid;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  const size_t colon = s.find(':');
  if (colon == 8) s.erase(0, 4);  // 8-digit domains (NVML, some CUDA versions) -> sysfs's 4 digits
  return s;
}

std::vector<std::string> pci_chain(const std::string& root, const std::string& busid) {
  const fs::path link = fs::path(root) / "bus" / "pci" / "devices" / normalize_busid(busid);
  std::error_code ec;
  const fs::path real = fs::canonical(link, ec);
  CZ_CHECK_IO(!ec, "topology: cannot resolve {} ({})", link.string(), ec.message());
  std::vector<std::string> chain;
  bool below_root_complex = false;
  for (const auto& part : real) {
    const std::string s = part.string();
    if (s.rfind("pci", 0) == 0 && s.find(':') != std::string::npos) {
      below_root_complex = true;  // "pci0000:17": the root complex
      chain.clear();
    } else if (below_root_complex && is_busid(s)) {
      chain.push_back(s);
    }
  }
  CZ_CHECK_IO(!chain.empty() && chain.back() == normalize_busid(busid),
              "topology: {} does not lead to PCI device {} under a root complex (it resolves to {})",
              link.string(), busid, real.string());
  return chain;
}

double pcie_lane_gbps(const std::string& speed) {
  double gts = 0;
  try {
    gts = std::stod(speed);
  } catch (...) {
    return 0;
  }
  // Per lane and direction, after line coding: 8b/10b up to PCIe 2, 128b/130b from PCIe 3.
  if (gts <= 0) return 0;
  if (gts <= 2.5) return 0.25;
  if (gts <= 5) return 0.5;
  if (gts <= 8) return 0.985;
  if (gts <= 16) return 1.969;
  if (gts <= 32) return 3.938;
  return 7.563;  // PCIe 6 (64 GT/s PAM4, FLIT mode)
}

double pci_link_gbps(const std::string& root, const std::string& busid) {
  const fs::path dev = fs::path(root) / "bus" / "pci" / "devices" / normalize_busid(busid);
  std::string speed = read_line(dev / "max_link_speed"), width = read_line(dev / "max_link_width");
  if (speed.empty() || width.empty()) {
    speed = read_line(dev / "current_link_speed");
    width = read_line(dev / "current_link_width");
  }
  int lanes = 0;
  try {
    lanes = std::stoi(width);
  } catch (...) {
    return 0;
  }
  return pcie_lane_gbps(speed) * lanes;
}

int pci_numa_node(const std::string& root, const std::string& busid) {
  const std::string s =
      read_line(fs::path(root) / "bus" / "pci" / "devices" / normalize_busid(busid) / "numa_node");
  try {
    return std::max(0, std::stoi(s));
  } catch (...) {
    return 0;
  }
}

int cpu_numa_node(const std::string& root, int cpu) {
  const fs::path nodes = fs::path(root) / "devices" / "system" / "node";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(nodes, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() <= 4) continue;
    if (in_cpulist(read_line(e.path() / "cpulist"), cpu)) {
      try {
        return std::stoi(name.substr(4));
      } catch (...) {
      }
    }
  }
  return 0;
}

std::vector<int> pci_local_cpus(const std::string& root, const std::string& busid) {
  const fs::path dev = fs::path(root) / "bus" / "pci" / "devices" / normalize_busid(busid);
  std::vector<int> cpus = parse_cpu_list(read_line(dev / "local_cpulist"));
  if (!cpus.empty()) return cpus;
  int node = -1;
  try {
    node = std::stoi(read_line(dev / "numa_node"));
  } catch (...) {
    return {};
  }
  if (node < 0) return {};
  return parse_cpu_list(
      read_line(fs::path(root) / "devices" / "system" / "node" / fmt::format("node{}", node) / "cpulist"));
}

std::string cuda_busid(int device) {
#if CZ_WITH_CUDA
  char buf[64] = {0};
  if (device >= 0 && cudaDeviceGetPCIBusId(buf, sizeof(buf), device) == cudaSuccess) return buf;
#else
  (void)device;
#endif
  return "";
}

double network_gbps(const std::string& root) {
  const fs::path net = fs::path(root) / "class" / "net";
  std::error_code ec;
  double best = 0;
  for (const auto& e : fs::directory_iterator(net, ec)) {
    if (e.path().filename() == "lo" || read_line(e.path() / "operstate") != "up") continue;
    try {
      best = std::max(best, std::stod(read_line(e.path() / "speed")) / 8000.0);  // Mb/s -> GB/s
    } catch (...) {
    }
  }
  return best;
}

RankPlace locate_rank(int rank, const std::string& host, const std::string& gpu_busid,
                      const DetectOptions& options) {
  const std::string root = sysfs_root(options);
  RankPlace p;
  p.rank = rank;
  p.host = host;
  p.net_gbps = network_gbps(root);
  if (gpu_busid.empty()) {
    const int cpu = sched_getcpu();
    p.numa = cpu >= 0 ? cpu_numa_node(root, cpu) : 0;
    return p;
  }
  p.gpu_busid = normalize_busid(gpu_busid);
  p.numa = pci_numa_node(root, p.gpu_busid);
  std::vector<double> own;
  for (const auto& b : pci_chain(root, p.gpu_busid)) {
    p.chain.push_back({b, 0});
    own.push_back(pci_link_gbps(root, b));
  }
  for (size_t i = 0; i < own.size(); ++i) {
    double bw = own[i];
    if (i > 0 && own[i - 1] > 0) bw = bw > 0 ? std::min(bw, own[i - 1]) : own[i - 1];
    p.chain[i].up_gbps = bw > 0 ? bw : kDefaultPcieGbps;
  }
  return p;
}

namespace {

// The tree's nodes in the order build_topology adds them; a node names its parent by index.
class TopoNodes {
 public:
  int add(std::string id, std::string type, int parent, double gbps) {
    TopoNode n;
    n.id = std::move(id);
    n.type = std::move(type);
    n.parent = parent;
    n.up_gbps = gbps;
    n.extra = nlohmann::ordered_json::object();
    nodes_.push_back(std::move(n));
    return int(nodes_.size() - 1);
  }
  TopoNode& operator[](int i) { return nodes_[size_t(i)]; }
  std::vector<TopoNode> take() { return std::move(nodes_); }

 private:
  std::vector<TopoNode> nodes_;
};

// One host's switches (a pair of bridges: upstream and downstream port) and GPUs, each once, in bus id order,
// under the CPU nodes of their NUMA nodes (`cpus`: numa -> node). `pre` prefixes the ids ("host1." of many).
void add_switches_and_gpus(TopoNodes& nodes, const std::string& pre,
                           const std::vector<const RankPlace*>& mine, std::map<int, int>& cpus) {
  std::map<std::string, const RankPlace*> gpus;
  for (auto* p : mine)
    if (!p->gpu_busid.empty()) gpus.emplace(p->gpu_busid, p);
  struct Switch {
    size_t depth;
    std::string parent_port;  // "" = the CPU
    int cpu;
    double gbps;
  };
  std::map<std::string, Switch> switches;  // by upstream port
  std::map<std::string, std::string> gpu_parent_port;
  for (auto& [busid, p] : gpus) {
    const auto& c = p->chain;
    std::string parent_port;
    for (size_t i = 1; i + 1 < c.size(); i += 2) {
      switches.emplace(c[i].busid, Switch{i, parent_port, cpus[p->numa], c[i].up_gbps});
      parent_port = c[i].busid;
    }
    gpu_parent_port[busid] = parent_port;
  }
  std::vector<std::string> ports;
  for (auto& [port, sw] : switches) ports.push_back(port);
  std::stable_sort(ports.begin(), ports.end(),
                   [&](const auto& a, const auto& b) { return switches[a].depth < switches[b].depth; });
  std::map<std::string, int> switch_node;
  int k = 0;
  for (const auto& port : ports) {  // parents (shallower) first
    const Switch& sw = switches[port];
    const int parent = sw.parent_port.empty() ? sw.cpu : switch_node.at(sw.parent_port);
    switch_node[port] = nodes.add(fmt::format("{}sw{}", pre, k++), "switch", parent, sw.gbps);
    nodes[switch_node[port]].extra["busid"] = port;
  }
  k = 0;
  for (auto& [busid, p] : gpus) {
    const std::string& pp = gpu_parent_port[busid];
    const int parent = pp.empty() ? cpus[p->numa] : switch_node.at(pp);
    const int g = nodes.add(fmt::format("{}gpu{}", pre, k++), "gpu", parent, p->chain.back().up_gbps);
    for (auto* q : mine)
      if (q->gpu_busid == busid) nodes[g].ranks.push_back(q->rank);
    nodes[g].extra["busid"] = busid;
    if (!p->gpu_name.empty()) nodes[g].extra["name"] = p->gpu_name;
  }
}

// Host `h` (named `name`) and what its ranks `mine` stand on: its CPUs, switches and GPUs, and a proc node
// for each rank without a GPU.
void add_host(TopoNodes& nodes, size_t h, const std::string& name, bool multi,
              const std::vector<const RankPlace*>& mine, const DetectOptions& options) {
  const std::string pre = multi ? fmt::format("host{}.", h) : "";
  double net = 0;
  int p2p = -1;
  for (auto* p : mine) {
    net = std::max(net, p->net_gbps);
    if (p->p2p >= 0) p2p = p2p < 0 ? p->p2p : std::min(p2p, p->p2p);
  }
  const int host = nodes.add(fmt::format("host{}", h), "host", -1, net > 0 ? net : options.net_gbps);
  nodes[host].extra["name"] = name;
  if (p2p >= 0) nodes[host].extra["gpu_p2p"] = p2p == 1;

  std::map<int, int> cpus;  // numa -> node
  std::set<int> numas;
  for (auto* p : mine) numas.insert(p->numa);
  for (int numa : numas) {
    cpus[numa] = nodes.add(fmt::format("{}cpu{}", pre, numa), "cpu", host, options.socket_gbps);
    nodes[cpus[numa]].extra["numa"] = numa;
  }
  add_switches_and_gpus(nodes, pre, mine, cpus);
  for (auto* p : mine) {
    if (!p->gpu_busid.empty()) continue;
    const int n = nodes.add(fmt::format("{}proc{}", pre, p->rank), "proc", cpus[p->numa], options.proc_gbps);
    nodes[n].ranks.push_back(p->rank);
  }
}

}  // namespace

Topology build_topology(const std::vector<RankPlace>& places, const DetectOptions& options) {
  // Hosts in order of their lowest rank.
  std::vector<const RankPlace*> sorted;
  for (const auto& p : places) sorted.push_back(&p);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  std::vector<std::string> hosts;
  for (auto* p : sorted)
    if (std::find(hosts.begin(), hosts.end(), p->host) == hosts.end()) hosts.push_back(p->host);
  TopoNodes nodes;
  for (size_t h = 0; h < hosts.size(); ++h) {
    std::vector<const RankPlace*> mine;
    for (auto* p : sorted)
      if (p->host == hosts[h]) mine.push_back(p);
    add_host(nodes, h, hosts[h], hosts.size() > 1, mine, options);
  }
  return Topology(nodes.take());
}

Topology detect_topology(const World& world, const DetectOptions& options) {
  if (const char* file = std::getenv("CZ_TOPO_FILE"); file && *file) {
    Topology t = Topology::load(file);
    CZ_CHECK(t.num_ranks() == world.size(), "topology: $CZ_TOPO_FILE {} places {} ranks but the job has {}",
             file, t.num_ranks(), world.size());
    return t;
  }
  std::string busid, gpu_name;
  int p2p = -1;
#if CZ_WITH_CUDA
  if (world.gpu() >= 0) {
    char buf[64] = {0};
    CZ_CUDA_COMM(cudaDeviceGetPCIBusId(buf, sizeof(buf), world.gpu()));
    busid = buf;
    cudaDeviceProp prop{};
    CZ_CUDA_COMM(cudaGetDeviceProperties(&prop, world.gpu()));
    gpu_name = prop.name;
    p2p = check_gpu_p2p_and_configure_nccl();
  }
#endif
  RankPlace mine;
  try {
    mine = locate_rank(world.rank(), world.hostname(), busid, options);
  } catch (const IoError&) {
    // A GPU whose sysfs entry cannot be read (containers without /sys/bus/pci): place it under its socket.
    mine = locate_rank(world.rank(), world.hostname(), "", options);
    mine.gpu_busid = normalize_busid(busid);
    mine.chain = {{mine.gpu_busid, kDefaultPcieGbps}};
  }
  mine.gpu_name = gpu_name;
  mine.p2p = p2p;
  const std::string text = place_to_json(mine).dump();
  const int len = int(text.size());
  std::vector<int> lens(size_t(world.size())), displs(size_t(world.size()));
  CZ_MPI(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, world.comm()));
  int total = 0;
  for (int r = 0; r < world.size(); ++r) displs[size_t(r)] = total, total += lens[size_t(r)];
  std::string all(size_t(total), '\0');
  CZ_MPI(MPI_Allgatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                        world.comm()));
  std::vector<RankPlace> places;
  for (int r = 0; r < world.size(); ++r)
    places.push_back(place_from_json(
        nlohmann::json::parse(all.substr(size_t(displs[size_t(r)]), size_t(lens[size_t(r)])))));
  return build_topology(places, options);
}

int check_gpu_p2p_and_configure_nccl() {
#if CZ_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1;
  bool all_ok = true, geforce = false;
  std::string detail;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    CZ_CUDA_COMM(cudaGetDeviceProperties(&prop, i));
    const std::string name = prop.name;
    // Consumer cards without NVLink: P2P over PCIe is absent or unreliable (RTX 4090), and NCCL can hang.
    if (name.find("GeForce") != std::string::npos || name.find("RTX 40") != std::string::npos) geforce = true;
    for (int j = 0; j < count; ++j) {
      if (i == j) continue;
      int ok = 0;
      CZ_CUDA_COMM(cudaDeviceCanAccessPeer(&ok, i, j));
      if (!ok) {
        all_ok = false;
        if (detail.empty()) detail = fmt::format("GPU {} cannot access GPU {} peer-to-peer", i, j);
      }
    }
  }
  if (count > 1 && geforce && all_ok) detail = "GeForce GPUs on PCIe (P2P reported but known to hang NCCL)";
  const bool disable = count > 1 && (!all_ok || geforce);
  static bool warned = false;
  if (disable && !std::getenv("NCCL_P2P_DISABLE")) {
    setenv("NCCL_P2P_DISABLE", "1", 1);
    if (!warned)
      fmt::print(stderr, "{}warning: {}; setting NCCL_P2P_DISABLE=1 so that NCCL goes through host memory\n",
                 log_prefix(), detail);
    warned = true;
  }
  return disable ? 0 : 1;
#else
  return -1;
#endif
}

}  // namespace cz::dist
