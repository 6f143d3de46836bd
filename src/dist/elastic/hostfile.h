// Open MPI hostfiles as the elastic supervisor reads and writes them: one host a line, "NAME slots=N"
// (other keys are refused; '#' starts a comment). The order of the lines is the order ranks fill the slots.
#pragma once

#include <string>
#include <vector>

namespace cz::elastic {

struct Host {
  std::string name;  // as mpirun and the rsh agent know it (a name or an address)
  int slots = 1;

  bool operator==(const Host&) const = default;
};

// ValueError naming the file and line for a bad line, a duplicate host or an empty file; IoError when the
// file cannot be read.
std::vector<Host> parse_hostfile_text(const std::string& text, const std::string& origin);
std::vector<Host> read_hostfile(const std::string& path);
void write_hostfile(const std::string& path, const std::vector<Host>& hosts);

// The hosts of a Slurm allocation (czrun in a job, without --hostfile): `names` as `scontrol show hostnames`
// lists them, each with the slots SLURM_TASKS_PER_NODE gives it ("2(x3),1": 2 on each of the first three
// nodes, 1 on the fourth; empty: 1 each). ValueError when the counts do not cover the nodes.
std::vector<Host> hosts_of_allocation(const std::vector<std::string>& names,
                                      const std::string& tasks_per_node);
// The node names of a Slurm node list (n[1-3],gpu7), from `scontrol show hostnames`; CommError when it fails.
std::vector<std::string> slurm_hostnames(const std::string& node_list);

int total_slots(const std::vector<Host>& hosts);
// The ranks [first, first + slots) of each host when ranks fill the slots in order (mpirun's --map-by slot).
struct Placement {
  Host host;
  int first_rank = 0;
};
std::vector<Placement> place_ranks(const std::vector<Host>& hosts);
// The first `world` slots of `hosts`, in order (the last host used may get fewer than its slots).
std::vector<Host> take_slots(const std::vector<Host>& hosts, int world);

}  // namespace cz::elastic
