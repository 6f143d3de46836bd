// One step, two descriptions (Note [One step, two descriptions] in src/dist/plan/step_replay.cpp): the
// planner's replay of a training step against the CPU allocator's own log of the real step (Note [Allocator
// event log]), allocation by allocation, for the configurations of plan_cases.h. A change to what an op or
// the engine allocates that the replay does not follow fails here, naming the op where the two part.
//
// Compared per step, on every rank: the training thread's sequence of requests (bytes as asked for) and,
// before each request, which earlier blocks were returned (the order of returns between two requests does not
// change what the allocator holds or hands out, so it is not compared). A block from before the step (model
// state, a checkpoint's host copy) is known by its size. Each communicator's thread (its ring scratch; a 2-D
// mesh has several: dist::current_communicator labels them) has its own sequence of requests, compared by
// size: one thread's order is fixed by its collectives' order, but the threads' requests interleave as timing
// has it, with each other and with the training thread's.
//
// The same run also compares the engine's scheduling decisions (Note [One schedule] in
// src/dist/zero/schedule.cpp): the events the real step's ReduceSchedule and UnitSchedule emit (launch and
// finish each partition's reduction, gather, use and release each stage-3 unit) against those the replay's
// emit, in order. Both run the same rules; what this checks is that the replay drives them from the same
// points as the engine's hooks (every gradient, every unit's module hooks, prefetch, flush). The what-if
// (src/dist/plan/what_if.cpp) drives the same step schedule (Note [Step plan]) for its timelines: its one
// steady-state step is compared with the real second step, event by event.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "dist/comm/communicator.h"
#include "dist/comm/topology_detect.h"
#include "dist/plan/planner.h"
#include "dist/plan/what_if.h"
#include "dist/train/plan_request.h"
#include "dist/train/trainer.h"
#include "dist/zero/schedule.h"
#include "plan_cases.h"
#include "tensor/allocator.h"
#include "tensor/profiler.h"

namespace cz::plan {
namespace {

// A returned block: the step's allocation index that made it, or -1 with its bytes for a block from before.
struct Freed {
  int64_t alloc;
  int64_t bytes;
  auto operator<=>(const Freed&) const = default;
};

// One request and the returns just before it; the last entry of Step::main (bytes -1) holds the returns after
// the step's last request.
struct Item {
  int64_t bytes = -1;
  std::string where;  // plan: its label and what the buffer is; step: the op running
  std::vector<Freed> freed_before;
};

// A request made on another thread (a communicator's, at stages 0-3 on several ranks: its ring scratch), with
// the number of the training thread's requests made before it. Its time is the other thread's; only the
// sizes, in that thread's order, are compared.
struct Aside {
  int64_t bytes;
  int64_t after;
  std::string where;
};

// A thread of no communicator (the loader's rows are skipped; a checkpoint writer or offload worker that
// began to allocate during a step would show here, with nothing planned).
constexpr const char* kNoCommunicator = "(no communicator)";

struct Step {
  std::vector<Item> main;
  std::map<std::string, std::vector<Aside>> aside;  // by thread: its communicator's label
};

void close_step(Step& s, std::vector<Freed>& freed) {
  std::sort(freed.begin(), freed.end());
  s.main.push_back({-1, "(end of step)", std::move(freed)});
  freed.clear();
}

// The real step's log. The calling thread's requests and returns are compared one by one; other threads'
// requests by size only (Aside), thread by thread; their returns are not logged. The loader's threads work at
// times of their own, so the rows with loader threads are left out.
class StepLog final : public AllocatorObserver {
 public:
  void allocated(const void* ptr, size_t nbytes) override {
    std::lock_guard lock(mu_);
    const std::string_view op = profiler::current_scope();
    if (std::this_thread::get_id() != thread_) {
      const std::string_view comm = dist::current_communicator();
      step_.aside[comm.empty() ? kNoCommunicator : std::string(comm)].push_back(
          {int64_t(nbytes), int64_t(step_.main.size()), ""});
      return;
    }
    std::sort(freed_.begin(), freed_.end());
    live_[ptr] = int64_t(step_.main.size());
    step_.main.push_back(
        {int64_t(nbytes), op.empty() ? "(outside any op)" : std::string(op), std::move(freed_)});
    freed_.clear();
  }
  void released(const void* ptr, size_t nbytes) override {
    std::lock_guard lock(mu_);
    if (std::this_thread::get_id() != thread_) return;
    const auto it = live_.find(ptr);
    if (it == live_.end()) {
      freed_.push_back({-1, int64_t(nbytes)});
    } else {
      freed_.push_back({it->second, 0});
      live_.erase(it);
    }
  }
  Step take() {
    std::lock_guard lock(mu_);
    close_step(step_, freed_);
    live_.clear();
    return std::exchange(step_, {});
  }

 private:
  std::mutex mu_;  // another thread may still be inside allocated() when take() runs
  std::thread::id thread_ = std::this_thread::get_id();
  std::unordered_map<const void*, int64_t> live_;
  Step step_;
  std::vector<Freed> freed_;
};

// The replay's events [begin, end) in the same form; a ring scratch is its communicator's thread's.
Step planned_step(const StepReplay& r, size_t begin, size_t end) {
  Step s;
  std::unordered_map<int32_t, int64_t> index;  // MemoryEvents id -> allocation index in this step
  std::vector<Freed> freed;
  for (size_t i = begin; i < end; ++i) {
    const TraceEvent& e = r.events[i];
    const std::string& label = e.where >= 0 ? r.labels.at(size_t(e.where)) : "(before any op)";
    if (e.thread) {
      if (e.alloc)
        s.aside[e.thread].push_back({e.bytes, int64_t(s.main.size()), fmt::format("{}: {}", label, e.what)});
    } else if (e.alloc) {
      std::sort(freed.begin(), freed.end());
      index[e.block] = int64_t(s.main.size());
      s.main.push_back({e.bytes, fmt::format("{}: {}", label, e.what), std::move(freed)});
      freed.clear();
    } else if (const auto it = index.find(e.block); it != index.end()) {
      freed.push_back({it->second, 0});
    } else {
      freed.push_back({-1, e.bytes});
    }
  }
  close_step(s, freed);
  return s;
}

std::string describe(const std::vector<Freed>& freed, const std::vector<Item>& s) {
  std::string out;
  for (const Freed& f : freed) {
    if (!out.empty()) out += ", ";
    out += f.alloc < 0 ? fmt::format("a block of {} B from before the step", f.bytes)
                       : fmt::format("#{} ({} B)", f.alloc, s[size_t(f.alloc)].bytes);
  }
  return out.empty() ? "nothing" : out;
}

std::string item(const std::vector<Item>& s, size_t i) {
  if (i >= s.size()) return "(nothing: the step ended)";
  if (s[i].bytes < 0) return fmt::format("(the step ends) in {}", s[i].where);
  return fmt::format("{} B in {}", s[i].bytes, s[i].where);
}

// "" when the two agree; else where they first part, with a few allocations of context from both.
std::string first_difference(const Step& plan, const Step& real) {
  const std::vector<Item>&p = plan.main, &r = real.main;
  const size_t n = std::min(p.size(), r.size());
  size_t k = 0;
  while (k < n && p[k].bytes == r[k].bytes && p[k].freed_before == r[k].freed_before) ++k;
  std::string msg;
  if (k < n || p.size() != r.size()) {
    msg += fmt::format("allocation #{} (of {} planned, {} made):\n  plan: {}\n  step: {}\n", k, p.size() - 1,
                       r.size() - 1, item(p, k), item(r, k));
    if (k < n && p[k].freed_before != r[k].freed_before)
      msg += fmt::format("  before it the plan returns {}\n           the step returns {}\n",
                         describe(p[k].freed_before, p), describe(r[k].freed_before, r));
    msg += "context (#: plan | step):\n";
    for (size_t i = k >= 4 ? k - 4 : 0; i < std::min(std::max(p.size(), r.size()), k + 4); ++i)
      msg += fmt::format("  {}{:>5}: {} | {}\n", i == k ? '>' : ' ', i, item(p, i), item(r, i));
    return msg;
  }
  // Thread by thread: every thread that either side has, each where its requests first part.
  std::map<std::string, int> threads;
  for (const auto& [name, asides] : plan.aside) threads[name];
  for (const auto& [name, asides] : real.aside) threads[name];
  const std::vector<Aside> none;
  for (const auto& [name, unused] : threads) {
    const auto pi = plan.aside.find(name), ri = real.aside.find(name);
    const std::vector<Aside>&pa = pi != plan.aside.end() ? pi->second : none,
          &ra = ri != real.aside.end() ? ri->second : none;
    size_t j = 0;
    while (j < std::min(pa.size(), ra.size()) && pa[j].bytes == ra[j].bytes) ++j;
    if (j == pa.size() && j == ra.size()) continue;
    msg += fmt::format("the {} communicator's thread: request {} of {} planned, {} made:\n", name, j,
                       pa.size(), ra.size());
    for (size_t i = j >= 2 ? j - 2 : 0; i < std::min(std::max(pa.size(), ra.size()), j + 3); ++i)
      msg += fmt::format(
          "  {}{:>3}: {} | {}\n", i == j ? '>' : ' ', i,
          i < pa.size() ? fmt::format("{} B in {} (after #{})", pa[i].bytes, pa[i].where, pa[i].after) : "-",
          i < ra.size() ? fmt::format("{} B (after #{}: {})", ra[i].bytes, ra[i].after,
                                      item(r, size_t(std::max<int64_t>(ra[i].after - 1, 0))))
                        : "-");
  }
  return msg;
}

std::string events_text(const std::vector<zero::ScheduleEvent>& e, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < std::min(to, e.size()); ++i)
    out += fmt::format(" {}{}", char(e[i].kind), e[i].index);
  return out.empty() ? " (none)" : out;
}

// "" when the two sequences agree; else where they first part, with context.
std::string first_schedule_difference(const std::vector<zero::ScheduleEvent>& plan,
                                      const std::vector<zero::ScheduleEvent>& real) {
  size_t k = 0;
  while (k < plan.size() && k < real.size() && plan[k] == real[k]) ++k;
  if (k == plan.size() && k == real.size()) return "";
  const size_t from = k >= 6 ? k - 6 : 0;
  return fmt::format(
      "event #{} (of {} planned, {} made; L launch, F finish, G gather, U use, R release, then the "
      "partition):\n  plan:{}\n  step:{}\n",
      k, plan.size(), real.size(), events_text(plan, from, k + 6), events_text(real, from, k + 6));
}

// The events of step `i` (1-based) of a real run whose steps ended at `ends`, as the what-if's steady state
// sees a step: the gathers the previous update launched (stages 1-2: what follows that step's last reduction
// event) first, then this step's events up to its own last reduction event.
std::vector<zero::ScheduleEvent> steady_step(const std::vector<zero::ScheduleEvent>& e,
                                             const std::vector<size_t>& ends, size_t i) {
  auto after_reductions = [&](size_t begin, size_t end) {
    size_t k = end;
    while (k > begin && e[k - 1].kind != zero::ScheduleEvent::launch &&
           e[k - 1].kind != zero::ScheduleEvent::finish && e[k - 1].kind != zero::ScheduleEvent::release)
      --k;
    return k;
  };
  const size_t before = i >= 3 ? ends[i - 3] : 0, begin = ends[i - 2], end = ends[i - 1];
  std::vector<zero::ScheduleEvent> out(e.begin() + long(after_reductions(before, begin)),
                                       e.begin() + long(begin));
  out.insert(out.end(), e.begin() + long(begin), e.begin() + long(after_reductions(begin, end)));
  return out;
}

// The what-if's events for the case's configuration on as many CPU ranks (hosts of ranks_per_host).
std::vector<zero::ScheduleEvent> what_if_events(const Case& c) {
  WhatIfRequest req = train::what_if_request(c.config);
  std::vector<dist::RankPlace> places;
  const int per_host = c.ranks_per_host > 0 ? c.ranks_per_host : c.ranks;
  for (int r = 0; r < c.ranks; ++r) {
    dist::RankPlace p;
    p.rank = r;
    p.host = fmt::format("host{}", r / per_host);
    places.push_back(std::move(p));
  }
  req.topology = dist::build_topology(places, dist::DetectOptions{});
  req.compute = default_compute_table(DType::f32);
  req.ranks = {c.ranks};
  req.stages = {c.config.stage};
  req.memory = false;
  std::vector<zero::ScheduleEvent> events;
  zero::set_schedule_log(&events);
  const std::unique_ptr<std::vector<zero::ScheduleEvent>, void (*)(std::vector<zero::ScheduleEvent>*)> stop(
      &events, [](std::vector<zero::ScheduleEvent>*) { zero::set_schedule_log(nullptr); });
  (void)what_if(req);
  return events;
}

class StepEvents : public ::testing::TestWithParam<Case> {};

TEST_P(StepEvents, EveryAllocationAsPlanned) {
  const Case& c = GetParam();
  if (c.config.loader_threads > 0) GTEST_SKIP() << "the loader's threads allocate at times of their own";
  if (!runs_here(c)) GTEST_SKIP() << "--precision bf16 on the CPU: this CPU has neither AVX512_BF16 nor AMX";
  dist::World& world = dist::World::get();
  ASSERT_EQ(c.ranks, world.size()) << "multi-rank rows run under mpirun";
  const bool saves = !c.config.checkpoint_dir.empty();
  if (saves && world.rank() == 0) std::filesystem::remove_all(c.config.checkpoint_dir);

  // The mesh's rows: the shard groups and hpZ's hosts.
  PlanRequest req = train::plan_request(c.config, c.ranks, c.ranks_per_host);
  req.rank = world.rank();
  // Auto decides each collective on the run's topology (collective: every rank runs every row).
  if (c.config.comm_impl == "auto" && world.size() > 1) req.topology = dist::detect_topology(world);
  std::vector<zero::ScheduleEvent> planned_schedule, real_schedule;
  zero::set_schedule_log(&planned_schedule);
  const StepReplay planned = plan_step_replay(req);
  zero::set_schedule_log(nullptr);
  ASSERT_EQ(planned.step_begins.size(), 2u);

  Allocator& alloc = allocator_for(Device::cpu());
  std::vector<Step> real;
  std::vector<size_t> step_ends;  // real_schedule's size after each step
  {
    train::Trainer t(c.config, world);
    StepLog log;
    const bool profiling = profiler::enabled();
    profiler::set_enabled(true);  // names the op each allocation happens in
    for (int i = 0; i < 2; ++i) {
      {
        alloc.set_observer(&log);
        zero::set_schedule_log(&real_schedule);
        const std::unique_ptr<Allocator, void (*)(Allocator*)> stop(&alloc, [](Allocator* a) {
          a->set_observer(nullptr);
          zero::set_schedule_log(nullptr);
        });
        t.step();
      }
      step_ends.push_back(real_schedule.size());
      real.push_back(log.take());
      if (saves && i == 0) {
        // Its host copy lives through the second step. The save waits for the stage 1-2 gathers the update
        // launched (ChunkSchedule::use_all), which the replay's steady state makes at the second step's unit
        // forwards: the same uses in the same order, logged here.
        zero::set_schedule_log(&real_schedule);
        t.save_checkpoint();
        zero::set_schedule_log(nullptr);
      }
    }
    profiler::set_enabled(profiling);
    profiler::take();
  }
  for (size_t i = 0; i < 2; ++i) {
    const size_t end = i + 1 < 2 ? planned.step_begins[i + 1] : planned.events.size();
    const Step plan = planned_step(planned, planned.step_begins[i], end);
    const std::string diff = first_difference(plan, real[i]);
    EXPECT_TRUE(diff.empty())
        << "rank " << world.rank() << ", step " << i + 1
        << ": the planner's replay (src/dist/plan/step_replay.cpp, engine_events.cpp) and "
           "the real step part at\n"
        << diff;
  }
  EXPECT_FALSE(real_schedule.empty()) << "the real steps emitted no scheduling event";
  const std::string diff = first_schedule_difference(planned_schedule, real_schedule);
  EXPECT_TRUE(diff.empty()) << "rank " << world.rank()
                            << ": the planner's replay (src/dist/plan/engine_events.cpp) and the real steps "
                               "schedule differently at\n"
                            << diff;
  // The what-if models neither a checkpoint's save between steps (it waits for the gathers, which the
  // second step's forward then finds done), nor activation checkpointing's recompute (its forward hooks run
  // again inside backward), nor offload's worker; its meshes are --shard-group world or host.
  if (saves || c.config.activation_checkpointing || c.config.offload_optimizer) return;
  if (c.config.shard_group != "world" && c.config.shard_group != "host") return;
  const std::vector<zero::ScheduleEvent> modelled = what_if_events(c);
  const std::string what_if_diff =
      first_schedule_difference(modelled, steady_step(real_schedule, step_ends, 2));
  EXPECT_TRUE(what_if_diff.empty()) << "rank " << world.rank()
                                    << ": the what-if (src/dist/plan/what_if.cpp, steady state) and the real "
                                       "second step schedule differently at\n"
                                    << what_if_diff;
}

INSTANTIATE_TEST_SUITE_P(Grid, StepEvents, ::testing::ValuesIn(my_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cz::plan
