// The comms table: a run's collectives grouped by kind and message size, with their count, time, bandwidth
// and exposed time in nccl-tests' units (sizes in bytes, times in us, bandwidths in GB/s = 1e9 B/s), as
// DeepSpeed's comms logger sums them. The engine's CommMeter fills it; convnext_zero --comms-table prints it
// at the end of a run and writes it into the log.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "dist/comm/types.h"

namespace cz::dist {

struct CommsRow {
  Collective kind = Collective::barrier;
  int64_t bytes = 0;  // nccl-tests' size: the whole buffer (count x element size)
  int ranks = 0;      // of the communicator it ran on
  int64_t count = 0;
  double total_s = 0;    // summed run time (Work::run_seconds)
  double exposed_s = 0;  // of it, the time the host waited while it ran (Note [Exposed communication])

  double mean_us() const { return count > 0 ? 1e6 * total_s / double(count) : 0; }
  // nccl-tests' algorithm and bus bandwidths of the mean call: bytes / time, and that x busbw_factor.
  double algbw_gbs() const { return total_s > 0 ? double(bytes) * double(count) / total_s / 1e9 : 0; }
  double busbw_gbs() const { return algbw_gbs() * busbw_factor(kind, ranks); }
};

class CommsTable {
 public:
  void add(Collective kind, int64_t bytes, int ranks, double run_s, double exposed_s);
  // Sorted by kind, then size, then ranks.
  std::vector<CommsRow> rows() const;
  bool empty() const { return rows_.empty(); }

 private:
  std::map<std::tuple<Collective, int64_t, int>, CommsRow> rows_;
};

// The table as text, one row per kind and size and a total line; "" for no rows. `title` heads it.
std::string format_comms_table(const std::vector<CommsRow>& rows, const std::string& title);
// [{"op", "size_bytes", "ranks", "count", "total_s", "mean_us", "algbw_gbs", "busbw_gbs", "exposed_s"}, ...]
nlohmann::json comms_table_json(const std::vector<CommsRow>& rows);

}  // namespace cz::dist
