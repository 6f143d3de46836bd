// Reading and writing the hostfiles the supervisor hands mpirun.
#include "dist/elastic/hostfile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "tensor/check.h"

namespace cz::elastic {

std::vector<Host> parse_hostfile_text(const std::string& text, const std::string& origin) {
  std::vector<Host> hosts;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    std::string word;
    bool slots_given = false;
    while (words >> word) {
      CZ_CHECK(word.rfind("slots=", 0) == 0 && !slots_given,
               "{} line {}: expected 'HOST slots=N', found '{}' (only slots= is understood)", origin, number,
               word);
      const std::string v = word.substr(6);
      CZ_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 6,
               "{} line {}: slots= needs a whole number, got '{}'", origin, number, v);
      h.slots = std::stoi(v);
      CZ_CHECK(h.slots >= 1, "{} line {}: slots must be at least 1, got {}", origin, number, h.slots);
      slots_given = true;
    }
    CZ_CHECK(seen.insert(h.name).second, "{} line {}: host {} is listed twice", origin, number, h.name);
    hosts.push_back(h);
  }
  CZ_CHECK(!hosts.empty(), "{}: no host in it", origin);
  return hosts;
}

std::vector<Host> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  CZ_CHECK_IO(f.good(), "{}: cannot read the hostfile", path);
  std::stringstream text;
  text << f.rdbuf();
  return parse_hostfile_text(text.str(), path);
}

void write_hostfile(const std::string& path, const std::vector<Host>& hosts) {
  std::ofstream f(path, std::ios::trunc);
  for (const Host& h : hosts) f << h.name << " slots=" << h.slots << "\n";
  f.flush();
  CZ_CHECK_IO(f.good(), "{}: cannot write the hostfile", path);
}

std::vector<Host> hosts_of_allocation(const std::vector<std::string>& names,
                                      const std::string& tasks_per_node) {
  std::vector<int> slots;
  std::istringstream in(tasks_per_node);
  for (std::string item; std::getline(in, item, ',');) {
    // "N" or "N(xK)".
    int n = 0, k = 1;
    char tail = 0;
    const int got = std::sscanf(item.c_str(), "%d(x%d%c", &n, &k, &tail);
    CZ_CHECK((got == 1 || (got == 3 && tail == ')')) && n >= 1 && k >= 1,
             "SLURM_TASKS_PER_NODE '{}': expected counts like 2(x3),1, found '{}'", tasks_per_node, item);
    slots.insert(slots.end(), size_t(k), n);
  }
  CZ_CHECK(tasks_per_node.empty() || slots.size() == names.size(),
           "SLURM_TASKS_PER_NODE '{}' gives {} nodes but the allocation has {}", tasks_per_node, slots.size(),
           names.size());
  std::vector<Host> hosts;
  for (size_t i = 0; i < names.size(); ++i) hosts.push_back({names[i], slots.empty() ? 1 : slots[i]});
  return hosts;
}

std::vector<std::string> slurm_hostnames(const std::string& node_list) {
  CZ_CHECK(!node_list.empty() && node_list.find_first_of("'\"$`\\;&|<> ") == std::string::npos,
           "'{}' is not a Slurm node list", node_list);
  const std::string cmd = fmt::format("scontrol show hostnames '{}' 2>&1", node_list);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  CZ_CHECK_T(CommError, pipe != nullptr, "could not run scontrol");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  CZ_CHECK_T(CommError, status == 0, "`scontrol show hostnames {}` failed: {}", node_list, out);
  std::vector<std::string> names;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) names.push_back(line);
  CZ_CHECK_T(CommError, !names.empty(), "`scontrol show hostnames {}` listed no node", node_list);
  return names;
}

int total_slots(const std::vector<Host>& hosts) {
  int n = 0;
  for (const Host& h : hosts) n += h.slots;
  return n;
}

std::vector<Placement> place_ranks(const std::vector<Host>& hosts) {
  std::vector<Placement> out;
  int next = 0;
  for (const Host& h : hosts) {
    out.push_back({h, next});
    next += h.slots;
  }
  return out;
}

std::vector<Host> take_slots(const std::vector<Host>& hosts, int world) {
  std::vector<Host> out;
  for (const Host& h : hosts) {
    if (world <= 0) break;
    out.push_back({h.name, std::min(h.slots, world)});
    world -= out.back().slots;
  }
  CZ_CHECK(world <= 0, "take_slots: {} more ranks than the hosts have slots", world);
  return out;
}

}  // namespace cz::elastic
