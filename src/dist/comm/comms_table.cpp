// The comms table's rows and how they print (comms_table.h).
#include "dist/comm/comms_table.h"

#include <algorithm>

#include <fmt/format.h>

namespace cz::dist {

void CommsTable::add(Collective kind, int64_t bytes, int ranks, double run_s, double exposed_s) {
  CommsRow& r = rows_[{kind, bytes, ranks}];
  r.kind = kind;
  r.bytes = bytes;
  r.ranks = ranks;
  ++r.count;
  r.total_s += run_s;
  r.exposed_s += exposed_s;
}

std::vector<CommsRow> CommsTable::rows() const {
  std::vector<CommsRow> out;
  for (const auto& [key, row] : rows_) out.push_back(row);
  return out;
}

// The columns of commbench's (and nccl-tests') rows where they mean the same: size (B), time (us), algbw and
// busbw (GB/s); then what only a run has: the count, the total and the part of it the host waited through.
std::string format_comms_table(const std::vector<CommsRow>& rows, const std::string& title) {
  if (rows.empty()) return "";
  std::string s = fmt::format("# {}\n", title);
  s += fmt::format("# {:>14} {:>12} {:>5} {:>7} {:>10} {:>10} {:>7} {:>7} {:>10} {:>7}\n", "op", "size",
                   "ranks", "count", "total", "time", "algbw", "busbw", "exposed", "hidden");
  s += fmt::format("# {:>14} {:>12} {:>5} {:>7} {:>10} {:>10} {:>7} {:>7} {:>10} {:>7}\n", "", "(B)", "", "",
                   "(ms)", "(us)", "(GB/s)", "(GB/s)", "(ms)", "");
  int64_t count = 0, bytes = 0;
  double total = 0, exposed = 0;
  for (const CommsRow& r : rows) {
    const std::string hidden =
        r.total_s > 0 ? fmt::format("{:.0f}%", 100 * std::max(0.0, 1 - r.exposed_s / r.total_s)) : "-";
    s += fmt::format("  {:>14} {:>12} {:>5} {:>7} {:>10.3f} {:>10.2f} {:>7.2f} {:>7.2f} {:>10.3f} {:>7}\n",
                     name(r.kind), r.bytes, r.ranks, r.count, 1e3 * r.total_s, r.mean_us(), r.algbw_gbs(),
                     r.busbw_gbs(), 1e3 * r.exposed_s, hidden);
    count += r.count;
    bytes += r.bytes * r.count;
    total += r.total_s;
    exposed += r.exposed_s;
  }
  s += fmt::format("# total: {} calls, {} bytes, {:.3f} ms, {:.3f} ms exposed ({:.0f}% hidden)\n", count,
                   bytes, 1e3 * total, 1e3 * exposed,
                   total > 0 ? 100 * std::max(0.0, 1 - exposed / total) : 0.0);
  return s;
}

nlohmann::json comms_table_json(const std::vector<CommsRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const CommsRow& r : rows)
    out.push_back({{"op", name(r.kind)},
                   {"size_bytes", r.bytes},
                   {"ranks", r.ranks},
                   {"count", r.count},
                   {"total_s", r.total_s},
                   {"mean_us", r.mean_us()},
                   {"algbw_gbs", r.algbw_gbs()},
                   {"busbw_gbs", r.busbw_gbs()},
                   {"exposed_s", r.exposed_s}});
  return out;
}

}  // namespace cz::dist
