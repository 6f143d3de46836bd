// The logs of an elastic run: each attempt's JSON-lines log (the trainer's records), what the supervisor
// copies from it into the command's --log, and the supervisor's own events beside them (Note [Elastic
// restarts] in supervisor.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cz::elastic {

// The records of a JSON-lines file, skipping a last line cut short by a crash; empty when it is missing.
std::vector<nlohmann::json> read_records(const std::string& path);
// The highest "step" of the step records ("split": "train"), or `otherwise` when there is none.
int64_t last_step(const std::vector<nlohmann::json>& records, int64_t otherwise);

// Appends records to a JSON-lines file (no-op for an empty path), one object a line, flushed.
class EventLog {
 public:
  EventLog(std::string path, bool truncate);
  void append(const nlohmann::json& record) const;
  // The records whose "step" is at most `upto` (every record when upto < 0).
  void append_records(const std::vector<nlohmann::json>& records, int64_t upto) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

double unix_time();  // seconds since the epoch, for the events' "t"

}  // namespace cz::elastic
