// --trace (step_tracer.h): turning the recorder on for steps A..B, each rank's part, rank 0's merge.
#include "dist/train/step_tracer.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tensor/check.h"
#include "tensor/trace.h"

namespace cz::train {

TraceSteps parse_trace_steps(const std::string& value, const std::string& flag) {
  TraceSteps s;
  const size_t colon = value.find(':');
  auto number = [&](std::string_view text, int64_t& out) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc() && end == text.data() + text.size() && !text.empty();
  };
  const bool ok = colon != std::string::npos && number(std::string_view(value).substr(0, colon), s.first) &&
                  number(std::string_view(value).substr(colon + 1), s.last);
  CZ_CHECK(ok, "{} must be A:B (the first and last step traced, e.g. 2:3), got '{}'", flag, value);
  CZ_CHECK(s.first >= 1 && s.first <= s.last, "{} must be A:B with 1 <= A <= B, got '{}'", flag, value);
  return s;
}

// Note [Trace clocks]: each rank times its spans on its own steady clock, whose origin is arbitrary and
// differs between hosts, so the ranks agree on a common zero instead: two all-gathers on the control
// communicator act as barriers (the first absorbs the ranks' different arrival times), and each rank takes
// the instant it leaves the second as time 0. The ranks leave a barrier within one message latency of each
// other (microseconds on one host, tens across hosts), which bounds the misalignment; the clocks' drift over
// a run of minutes is far below that. A step's span on rank 0 and rank 1 can therefore be compared directly.
StepTracer::StepTracer(std::string file, TraceSteps steps, const dist::ProcessGroup& control, int rank,
                       int world, Device device)
    : file_(std::move(file)), steps_(steps), control_(control), rank_(rank), world_(world), device_(device) {
  // Each rank's part goes next to FILE (a shared directory across hosts, as checkpoints need); rank 0 also
  // writes FILE. Every rank learns every rank's answer, so all stop with the same message.
  std::string why;
  for (const std::string& path : {part_path(rank_), rank_ == 0 ? file_ : std::string()}) {
    if (path.empty() || !why.empty()) continue;
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
      why = fmt::format("{} ({})", path, std::strerror(errno));
      continue;
    }
    std::fclose(f);
    std::remove(path.c_str());
  }
  const std::vector<double> bad = control_.all_gather({why.empty() ? 0.0 : 1.0});
  for (int r = 0; r < world_; ++r)
    CZ_CHECK(bad[size_t(r)] == 0, "--trace {}: rank {} cannot write {}", file_, r,
             r == rank_ ? why : "its part " + part_path(r));
  trace::set_thread_lane("compute");
  control_.all_gather({0.0});
  control_.all_gather({0.0});
  trace::set_zero(trace::Clock::now());
}

StepTracer::~StepTracer() {
  for (auto& [m, id] : hooks_) m->remove_hook(id);
  // Note [Trace after a failure]: a run that leaves while tracing did not reach finish().
  if (started_ && !written_) {
    try {
      write_alone();
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}--trace: this rank's events were not written: {}\n", log_prefix(), e.what());
    }
  }
}

void StepTracer::watch_blocks(nn::Module& model, const std::vector<std::string>& units, bool numbered) {
  for (size_t u = 0; u < units.size(); ++u) {
    nn::Module* m = model.find_module(units[u]);
    CZ_CHECK(m != nullptr, "--trace: the model has no module '{}'", units[u]);
    const std::string name = numbered ? fmt::format("unit {}: {}", u, units[u]) : units[u];
    hooks_.emplace_back(m, m->register_forward_pre_hook([name](nn::Module&, const Tensor&) {
      if (trace::active()) trace::set_block(name + " (forward)");
    }));
    hooks_.emplace_back(m, m->register_forward_hook([](nn::Module&, const Tensor&, const Tensor&) {
      if (trace::active()) trace::set_block({});
    }));
    hooks_.emplace_back(m, m->register_backward_pre_hook([name](nn::Module&) {
      if (trace::active()) trace::set_block(name + " (backward)");
    }));
  }
}

void StepTracer::memory_sample(int64_t allocated_bytes) const {
  if (trace::active())
    trace::counter(fmt::format("memory ({})", device_.str()),
                   fmt::format("{{\"allocated\": {}}}", allocated_bytes));
}

std::string StepTracer::part_path(int rank) const {
  return fmt::format("{}.rank{}", file_, rank);
}

void StepTracer::before_step(int64_t step) {
  if (written_ || step < steps_.first || step > steps_.last) return;
  if (!started_) trace::set_device_zero(device_);  // Note [Trace device times]
  started_ = true;
  trace::set_active(true);
}

void StepTracer::after_step(int64_t step) {
  if (step >= steps_.last) finish();
}

void StepTracer::finish() {
  if (written_) return;
  trace::set_active(false);
  write();
  written_ = true;
}

nlohmann::json StepTracer::take_events() const {
  using nlohmann::json;
  json events = json::array();
  std::map<std::string, int> tids;  // lane -> tid, in order of first use
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", 0},
                    {"args", {{"name", fmt::format("rank {}", rank_)}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", 0},
                    {"args", {{"sort_index", rank_}}}});
  for (trace::Event& e : trace::take()) {
    auto [it, added] = tids.try_emplace(e.lane, int(tids.size()) + 1);
    if (added)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", rank_},
                        {"tid", it->second},
                        {"args", {{"name", e.lane}}}});
    json j = {{"name", e.name}, {"cat", e.cat},      {"ph", std::string(1, e.ph)},
              {"pid", rank_},   {"tid", it->second}, {"ts", e.ts_us}};
    if (e.ph == 'X') j["dur"] = e.dur_us;
    if (e.ph == 'i') j["s"] = "t";
    if (!e.args_json.empty()) j["args"] = json::parse(e.args_json, nullptr, false);
    events.push_back(std::move(j));
  }
  return events;
}

// Note [Trace after a failure]: a collective that failed (a timeout, a dead peer) leaves the run inside
// A:B, with peers that may never write their part again, so nothing collective can run. Each rank that still
// runs writes its own events as a whole trace, without the others: rank 0 to FILE, rank N to FILE.rankN
// (where the merge would have read its part), to a temporary name first so that a reader never sees a torn
// file. Perfetto opens each; their clocks share the zero of Note [Trace clocks], so they line up when loaded
// together.
void StepTracer::write_alone() {
  using nlohmann::json;
  trace::set_active(false);
  written_ = true;
  const std::string path = rank_ == 0 ? file_ : part_path(rank_);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << json{{"traceEvents", take_events()},
                {"displayTimeUnit", "ms"},
                {"otherData",
                 {{"steps", fmt::format("{}:{}", steps_.first, steps_.last)},
                  {"ranks", world_},
                  {"rank", rank_},
                  {"incomplete", "the run failed inside these steps: this rank's events up to the failure"}}}}
               .dump();
    CZ_CHECK(out.good(), "--trace: rank {} could not write {}", rank_, tmp);
  }
  CZ_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "--trace: rank {} could not rename {} to {}: {}",
           rank_, tmp, path, std::strerror(errno));
  fmt::print(stderr, "{}--trace: this rank's events up to the failure are in {}\n", log_prefix(), path);
}

void StepTracer::write() {
  using nlohmann::json;
  json events = take_events();
  {
    std::ofstream out(part_path(rank_));
    out << events.dump();
    CZ_CHECK(out.good(), "--trace: rank {} could not write {}", rank_, part_path(rank_));
  }
  control_.all_gather({0.0});  // every part is on disk
  if (rank_ == 0) {
    json all = json::array();
    for (int r = 0; r < world_; ++r) {
      std::ifstream in(part_path(r));
      CZ_CHECK(in.good(), "--trace: rank 0 cannot read rank {}'s part {} (is the directory shared?)", r,
               part_path(r));
      for (json& e : json::parse(in)) all.push_back(std::move(e));
      std::remove(part_path(r).c_str());
    }
    std::ofstream out(file_);
    out << json{{"traceEvents", std::move(all)},
                {"displayTimeUnit", "ms"},
                {"otherData",
                 {{"steps", fmt::format("{}:{}", steps_.first, steps_.last)}, {"ranks", world_}}}}
               .dump();
    CZ_CHECK(out.good(), "--trace: could not write {}", file_);
  }
  control_.all_gather({0.0});  // rank 0 has read every part
}

}  // namespace cz::train
