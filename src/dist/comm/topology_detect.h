// Discovering the topology of the machines a job runs on: each rank's GPU PCI bus id and its chain of PCIe
// bridges up to the root complex (read from sysfs, as NCCL does), its NUMA node and host; gathered over MPI
// into one Topology that every rank builds identically. Also the GPU peer-to-peer check and the NCCL
// workaround for PCIe boxes where P2P does not work.
#pragma once

#include <string>
#include <vector>

#include "dist/comm/topology.h"

namespace cz::dist {

class World;

struct DetectOptions {
  std::string sysfs_root = "/sys";  // $CZ_SYSFS_ROOT overrides (tests point it at fake trees)
  double socket_gbps = 20;          // the link between sockets, which sysfs does not describe
  double proc_gbps = 10;            // a CPU rank's link to its socket (memory copies), for predictions
  double net_gbps = 12.5;           // a host's network link when no NIC speed is readable
};

// One PCI device on the way from the root complex to a GPU, with its upstream link's bandwidth.
struct PciHop {
  std::string busid;  // "0000:1b:00.0"
  double up_gbps = 0;
};

// Where one rank runs; what each rank contributes to the gathered topology.
struct RankPlace {
  int rank = 0;
  std::string host;
  int numa = 0;
  double net_gbps = 0;
  std::string gpu_busid;  // empty for a CPU rank
  std::string gpu_name;
  std::vector<PciHop> chain;  // root port first, the GPU last (its up_gbps is the GPU's own link)
  int p2p = -1;               // 1: all local GPU pairs can use P2P, 0: some cannot, -1: unknown / no GPU
};

// --- sysfs (any root, so that tests can use fake trees) ---
// "0000:1B:00.0" or "00000000:1B:00.0" -> "0000:1b:00.0".
std::string normalize_busid(const std::string& busid);
// The PCI devices from the root port down to `busid` (inclusive), from <root>/bus/pci/devices/<busid>.
std::vector<std::string> pci_chain(const std::string& root, const std::string& busid);
// GB/s per direction that a device's link supports (max_link_speed x max_link_width); 0 when sysfs does not
// say. A link runs at the lower of its two ends' figures.
double pci_link_gbps(const std::string& root, const std::string& busid);
// GB/s for one lane at a link speed string such as "16.0 GT/s PCIe" (0 when unknown).
double pcie_lane_gbps(const std::string& speed);
int pci_numa_node(const std::string& root, const std::string& busid);  // 0 when unknown (-1 in sysfs)
int cpu_numa_node(const std::string& root, int cpu);                   // the node listing this CPU, else 0
double network_gbps(const std::string& root);                          // fastest NIC that is up; 0 if none
// The CPUs near a PCI device: its local_cpulist, else the cpulist of its NUMA node; empty when sysfs says
// neither (Note [A rank's CPUs on a node] in tensor/cpu_share.h).
std::vector<int> pci_local_cpus(const std::string& root, const std::string& busid);
// The PCI bus id of CUDA device `device` ("" without CUDA or without the device).
std::string cuda_busid(int device);
// sysfs_root(): $CZ_SYSFS_ROOT, else options.sysfs_root.
std::string sysfs_root(const DetectOptions& options = {});

// This rank's place (GPU from `gpu_busid`, or a CPU rank when empty).
RankPlace locate_rank(int rank, const std::string& host, const std::string& gpu_busid,
                      const DetectOptions& options);
// The tree for a whole job: host -> cpu (NUMA node) -> switches -> gpu, or cpu -> proc for CPU ranks.
Topology build_topology(const std::vector<RankPlace>& places, const DetectOptions& options);
// Collective over `world`: locates every rank and builds the same Topology everywhere. $CZ_TOPO_FILE, when
// set, is loaded instead.
Topology detect_topology(const World& world, const DetectOptions& options = {});

// Can every pair of this process's visible GPUs use peer-to-peer? On PCIe-only GeForce boxes (RTX 4090) P2P
// is missing or broken and NCCL is known to hang unless it is disabled: then this warns once and sets
// NCCL_P2P_DISABLE=1 (unless the user set it), which must happen before NCCL initialises. Returns 1 / 0, or
// -1 without GPUs.
int check_gpu_p2p_and_configure_nccl();

}  // namespace cz::dist
