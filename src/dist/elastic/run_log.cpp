// Reading attempt logs and writing the supervisor's events.
#include "dist/elastic/run_log.h"

#include <chrono>
#include <fstream>

#include "tensor/check.h"

namespace cz::elastic {

std::vector<nlohmann::json> read_records(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

int64_t last_step(const std::vector<nlohmann::json>& records, int64_t otherwise) {
  int64_t last = otherwise;
  for (const auto& r : records)
    if (r.contains("step") && r.value("split", "") == "train" && !r.contains("event"))
      last = std::max(last, r["step"].get<int64_t>());
  return last;
}

EventLog::EventLog(std::string path, bool truncate) : path_(std::move(path)) {
  if (path_.empty()) return;
  std::ofstream f(path_, truncate ? std::ios::trunc : std::ios::app);
  CZ_CHECK_IO(f.good(), "{}: cannot open the log for writing", path_);
}

void EventLog::append(const nlohmann::json& record) const {
  if (path_.empty()) return;
  std::ofstream f(path_, std::ios::app);
  f << record.dump() << "\n";
  f.flush();
  CZ_CHECK_IO(f.good(), "{}: cannot append to the log", path_);
}

void EventLog::append_records(const std::vector<nlohmann::json>& records, int64_t upto) const {
  if (path_.empty()) return;
  std::ofstream f(path_, std::ios::app);
  for (const auto& r : records)
    if (upto < 0 || !r.contains("step") || r["step"].get<int64_t>() <= upto) f << r.dump() << "\n";
  f.flush();
  CZ_CHECK_IO(f.good(), "{}: cannot append to the log", path_);
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace cz::elastic
