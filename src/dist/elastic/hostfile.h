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
