// Reading and writing the hostfiles the supervisor hands mpirun.
#include "dist/elastic/hostfile.h"

#include <fmt/format.h>

#include <algorithm>
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
