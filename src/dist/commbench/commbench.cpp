// commbench: collective benchmarks in the manner of nccl-tests (sizes from -b to -e, out-of-place and
// in-place columns, algbw/busbw with nccl-tests' factors, #wrong from a check against locally computed
// values, the time's spread over iterations and ranks, a deadline per size), and the topology views.
#include "dist/commbench/commbench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <ostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/comm/topology.h"
#include "dist/comm/topology_detect.h"
#include "dist/commbench/bench_internal.h"
#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/element_value.h"
#include "tensor/parallel.h"
#include "tensor/stream.h"

namespace cz::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Inputs are multiples of 1/8 in [-1, 1], so sums over a few dozen ranks are exact in every dtype (bf16
// included) and any wrong element is a real error, not rounding.
double input_value(int rank, int64_t index, int rep) {
  return double(int((index * 7 + rank * 13 + rep * 5) % 17) - 8) / 8.0;
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-6;
    case DType::f16:
      return 1e-3;
    default:
      return 1e-2;
  }
}

// Fixed-width numbers like nccl-tests' columns: as many decimals as fit.
std::string num(double v, int width) {
  if (!std::isfinite(v)) return fmt::format("{:>{}}", "nan", width);
  if (v < std::pow(10.0, width - 3)) return fmt::format("{:>{}.2f}", v, width);
  if (v < std::pow(10.0, width - 2)) return fmt::format("{:>{}.1f}", v, width);
  if (v < std::pow(10.0, width)) return fmt::format("{:>{}.0f}", v, width);
  return fmt::format("{:>{}.1e}", v, width);
}

// Each rank's figures for one placement of one size (us): time (nccl-tests'), then Note [Time spread]'s.
using RankFigures = std::array<double, 5>;

struct Placement {
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;  // -1: not checked
  TimeSpread spread;   // over iterations and ranks (Note [Time spread])
  std::vector<RankFigures> ranks;
};

class CollectiveBench {
 public:
  CollectiveBench(World& world, const CommBenchOptions& o, Communicator& comm, Communicator& ctl)
      : world_(world),
        o_(o),
        comm_(comm),
        ctl_(ctl),
        kind_(parse_collective(o.op)),
        device_(parse_device(o.device)) {
    CZ_CHECK(kind_ == Collective::all_reduce || kind_ == Collective::reduce_scatter ||
                 kind_ == Collective::all_gather || kind_ == Collective::broadcast,
             "commbench: -o takes all_reduce, reduce_scatter, all_gather, broadcast or copy, not {}", o.op);
    CZ_CHECK(o.root >= 0 && o.root < world.size(), "commbench: root {} is not a rank of {}", o.root,
             world.size());
  }

  bool reduces() const { return kind_ == Collective::all_reduce || kind_ == Collective::reduce_scatter; }
  Collective kind() const { return kind_; }

  // One size: out-of-place then in-place.
  std::pair<Placement, Placement> run(int64_t count) {
    const int n = world_.size(), me = world_.rank();
    const size_t es = dtype_size(o_.dtype);
    const int64_t shard = shard_count(count, n, me), off = shard_offset(count, n, me);
    const int64_t send_elems = kind_ == Collective::all_gather ? shard : count;
    const int64_t recv_elems = kind_ == Collective::reduce_scatter ? shard : count;
    std::pair<Placement, Placement> result;
    {
      BenchBuffer send(device_, size_t(send_elems) * es), recv(device_, size_t(recv_elems) * es);
      result.first = measure(count, send, recv, send.data(), recv.data(), false);
    }
    {
      BenchBuffer buf(device_, size_t(count) * es);
      char* base = static_cast<char*>(buf.data());
      void* s = base;
      void* r = base;
      if (kind_ == Collective::reduce_scatter) r = base + size_t(off) * es;
      if (kind_ == Collective::all_gather) s = base + size_t(off) * es;
      result.second = measure(count, buf, buf, s, r, true);
    }
    return result;
  }

 private:
  WorkHandle issue(int64_t count, const void* s, void* r) {
    switch (kind_) {
      case Collective::all_reduce:
        return comm_.all_reduce(s, r, count, o_.dtype, device_, o_.redop);
      case Collective::reduce_scatter:
        return comm_.reduce_scatter(s, r, count, o_.dtype, device_, o_.redop);
      case Collective::all_gather:
        return comm_.all_gather(s, r, count, o_.dtype, device_);
      default:
        return comm_.broadcast(s, r, count, o_.dtype, device_, o_.root);
    }
  }

  Placement measure(int64_t count, BenchBuffer& sbuf, BenchBuffer& rbuf, void* s, void* r, bool in_place) {
    const int n = world_.size();
    Placement p;
    for (int i = 0; i < o_.warmup; ++i) issue(count, s, r)->synchronize();
    ctl_.barrier()->wait();
    // Keeps the pipeline full, as issuing all -n calls before waiting did, but holds kWindow handles instead
    // of -n of them (a handle and its finished Work are about 0.3 KB: gigabytes for a long run).
    constexpr size_t kWindow = 64;
    std::deque<WorkHandle> works;
    const auto t0 = Clock::now();
    for (int i = 0; i < o_.iters; ++i) {
      works.push_back(issue(count, s, r));
      if (works.size() > kWindow) {
        works.front()->synchronize();
        works.pop_front();
      }
    }
    for (auto& w : works) w->synchronize();
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count() / std::max(1, o_.iters);
    // Note [Time spread]: the same number of iterations again, each waited for before the next.
    std::vector<double> one(size_t(std::max(1, o_.iters)));
    for (double& t : one) {
      const auto a = Clock::now();
      issue(count, s, r)->synchronize();
      t = std::chrono::duration<double, std::micro>(Clock::now() - a).count();
    }
    const TimeSpread mine = time_spread(one);
    if (o_.check) p.wrong = check(count, sbuf, rbuf, s, r, in_place);
    // Every rank's figures to every rank; nccl-tests sums the wrong elements.
    constexpr int kFields = 6;
    const double figures[kFields] = {sec * 1e6,   mine.min_us, mine.p50_us,
                                     mine.p99_us, mine.max_us, double(std::max<int64_t>(p.wrong, 0))};
    std::vector<double> all(size_t(kFields * n));
    ctl_.all_gather(figures, all.data(), kFields * n, DType::f64, Device::cpu())->wait();
    std::vector<double> field(static_cast<size_t>(n));
    auto column = [&](int f) -> const std::vector<double>& {
      for (int q = 0; q < n; ++q) field[size_t(q)] = all[size_t(q * kFields + f)];
      return field;
    };
    p.time_us = aggregate_over_ranks(column(0), o_.average);
    p.spread.min_us = aggregate_over_ranks(column(1), 2);
    p.spread.p50_us = aggregate_over_ranks(column(2), o_.average);
    p.spread.p99_us = aggregate_over_ranks(column(3), o_.average);
    p.spread.max_us = aggregate_over_ranks(column(4), 3);
    if (o_.check) {
      const std::vector<double>& w = column(5);
      p.wrong = int64_t(std::accumulate(w.begin(), w.end(), 0.0));
    }
    for (int q = 0; q < n; ++q) {
      RankFigures f;
      std::copy_n(all.begin() + q * kFields, f.size(), f.begin());
      p.ranks.push_back(f);
    }
    const double bytes = double(count) * double(dtype_size(o_.dtype));
    p.algbw = bytes / (p.time_us * 1e-6) / 1e9;
    p.busbw = p.algbw * busbw_factor(kind_, n);
    return p;
  }

  int64_t check(int64_t count, BenchBuffer& sbuf, BenchBuffer& rbuf, void* s, void* r, bool in_place) {
    const int n = world_.size(), me = world_.rank();
    const DType dt = o_.dtype;
    const int64_t shard = shard_count(count, n, me), off = shard_offset(count, n, me);
    static int rep = 0;
    ++rep;
    // Outputs start as a value no result can have, so unwritten elements count as wrong. Inputs: element i of
    // the full buffer holds input_value(rank, i); all-gather sends our shard of it.
    constexpr double kSentinel = -1000.0;
    const int64_t recv_total = in_place ? count : (kind_ == Collective::reduce_scatter ? shard : count);
    for (int64_t i = 0; i < recv_total; ++i) store_element(dt, rbuf.host(), i, kSentinel);
    if (!in_place) rbuf.upload();
    char* hs = sbuf.host() + (static_cast<char*>(s) - static_cast<char*>(sbuf.data()));
    const int64_t first = kind_ == Collective::all_gather ? off : 0;
    const int64_t elems = kind_ == Collective::all_gather ? shard : count;
    for (int64_t i = 0; i < elems; ++i) store_element(dt, hs, i, input_value(me, first + i, rep));
    sbuf.upload();
    issue(count, s, r)->synchronize();
    rbuf.download();
    const char* hr = rbuf.host() + (static_cast<char*>(r) - static_cast<char*>(rbuf.data()));
    const double scale = o_.redop == ReduceOp::avg ? 1.0 / n : 1.0;
    auto expected = [&](int64_t i) {  // i: index into the full buffer
      if (kind_ == Collective::broadcast) return input_value(o_.root, i, rep);
      if (kind_ == Collective::all_gather) {
        int owner = 0;
        while (owner + 1 < n && shard_offset(count, n, owner + 1) <= i) ++owner;
        return input_value(owner, i, rep);
      }
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += input_value(q, i, rep);
      return sum * scale;
    };
    const int64_t out_first = kind_ == Collective::reduce_scatter ? off : 0;
    const int64_t out_elems = kind_ == Collective::reduce_scatter ? shard : count;
    const double tol = tolerance(dt);
    int64_t wrong = 0;
    for (int64_t i = 0; i < out_elems; ++i) {
      const double want = expected(out_first + i), got = load_element(dt, hr, i);
      if (!(std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want)))) ++wrong;
    }
    return wrong;
  }

  World& world_;
  const CommBenchOptions& o_;
  Communicator& comm_;
  Communicator& ctl_;
  Collective kind_;
  Device device_;
};

std::vector<int64_t> sizes(const CommBenchOptions& o) {
  CZ_CHECK(o.min_bytes > 0 && o.max_bytes >= o.min_bytes, "commbench: need 0 < -b ({}) <= -e ({})",
           o.min_bytes, o.max_bytes);
  CZ_CHECK(o.step_factor > 1 || o.step_bytes > 0, "commbench: need -f > 1 or -i > 0");
  std::vector<int64_t> out;
  for (double b = double(o.min_bytes); b <= double(o.max_bytes) + 0.5;
       b = o.step_factor > 1 ? b * o.step_factor : b + double(o.step_bytes))
    out.push_back(int64_t(b));
  return out;
}

nlohmann::ordered_json spread_json(const TimeSpread& t) {
  return {{"min_us", t.min_us}, {"p50_us", t.p50_us}, {"p99_us", t.p99_us}, {"max_us", t.max_us}};
}

const char* average_name(int average) {
  static const char* const kNames[] = {"rank 0", "mean", "min", "max"};
  return kNames[std::clamp(average, 0, 3)];
}

}  // namespace

TimeSpread time_spread(std::vector<double> times_us) {
  TimeSpread t;
  if (times_us.empty()) return t;
  std::sort(times_us.begin(), times_us.end());
  const auto nearest_rank = [&](double p) {
    const size_t k = size_t(std::ceil(p / 100.0 * double(times_us.size())));
    return times_us[std::clamp<size_t>(k, 1, times_us.size()) - 1];
  };
  t.min_us = times_us.front();
  t.p50_us = nearest_rank(50);
  t.p99_us = nearest_rank(99);
  t.max_us = times_us.back();
  return t;
}

double aggregate_over_ranks(const std::vector<double>& per_rank, int average) {
  CZ_CHECK(!per_rank.empty(), "aggregate_over_ranks: no ranks");
  switch (average) {
    case 0:
      return per_rank.front();
    case 2:
      return *std::min_element(per_rank.begin(), per_rank.end());
    case 3:
      return *std::max_element(per_rank.begin(), per_rank.end());
    default:
      return std::accumulate(per_rank.begin(), per_rank.end(), 0.0) / double(per_rank.size());
  }
}

int64_t parse_size(const std::string& s) {
  CZ_CHECK(!s.empty(), "empty size");
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw ValueError(fmt::format("'{}' is not a size (e.g. 8, 64K, 32M, 1G)", s));
  }
  const std::string suffix = s.substr(pos);
  double mult = 1;
  if (suffix == "K" || suffix == "k")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "m")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g")
    mult = 1024.0 * 1024 * 1024;
  else
    CZ_CHECK(suffix.empty(), "'{}' is not a size (e.g. 8, 64K, 32M, 1G)", s);
  CZ_CHECK(v >= 0, "size '{}' is negative", s);
  return int64_t(v * mult);
}

DType parse_bench_dtype(const std::string& s) {
  if (s == "float" || s == "f32") return DType::f32;
  if (s == "double" || s == "f64") return DType::f64;
  if (s == "half" || s == "f16") return DType::f16;
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  throw ValueError(fmt::format("unknown dtype '{}' (expected float, double, half or bfloat16)", s));
}

std::string bench_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float";
    case DType::f64:
      return "double";
    case DType::f16:
      return "half";
    case DType::bf16:
      return "bfloat16";
    default:
      return std::string(dtype_name(dtype));
  }
}

void print_ring_report(const Topology& topology, std::ostream& out) {
  constexpr double kBytes = 64.0 * 1024 * 1024;  // a 64 MiB reduce-scatter
  const std::vector<int> ring = topology.ring_order();
  std::vector<int> rank_order(ring.size());
  for (size_t i = 0; i < rank_order.size(); ++i) rank_order[i] = int(i);
  const RingPrediction best = topology.predict(ring, kBytes);
  const RingPrediction plain = topology.predict(rank_order, kBytes);
  out << "ring: " << fmt::format("{}", fmt::join(ring, " ")) << "\n";
  out << fmt::format("predicted_busbw_GBps: {:.2f}\n", best.busbw_gbps);
  out << fmt::format("rank_order_busbw_GBps: {:.2f}\n", plain.busbw_gbps);
  out << fmt::format(
      "# 64 MiB reduce-scatter over {} ranks; ring bottleneck: {}; rank order bottleneck: {}; "
      "ratio {:.2f}\n",
      ring.size(), best.bottleneck.empty() ? "none" : best.bottleneck,
      plain.bottleneck.empty() ? "none" : plain.bottleneck,
      plain.busbw_gbps > 0 ? best.busbw_gbps / plain.busbw_gbps : 0.0);
}

namespace {

// The communicator under measurement: -B's backend (NCCL on a GPU, MPI on the CPU by default), -I's
// algorithm.
CommOptions measured_comm_options(const CommBenchOptions& o, Device device) {
  CommOptions co;
  co.backend =
      o.backend.empty() ? (device.is_cuda() ? Backend::nccl : Backend::mpi) : parse_backend(o.backend);
  co.algorithm = o.impl;
  co.device = device;
  co.timeout_s = o.timeout_s;
  co.slice_bytes = o.slice_bytes;
  return co;
}

// What every row of a run says besides its size: the element type, the reduction, the root.
struct RowLabels {
  std::string type, redop;
  int root = -1;
};

// The table's header, as nccl-tests prints it, with this run's settings and ranks.
void print_table_header(const CommBenchOptions& o, World& world, Collective kind, Backend backend,
                        Communicator& comm, Device device, std::ostream& out) {
  out << fmt::format(
      "# commbench {}: impl {}, backend {}, device {}, {} ranks ({} on this host of {} cores; rank 0 may "
      "use "
      "{}), comm timeout {} s\n",
      name(kind), name(o.impl), name(backend), o.device, world.size(), world.local_size(),
      std::thread::hardware_concurrency(), available_cores(), o.timeout_s);
  out << fmt::format(
      "# minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} validation: {}\n", o.min_bytes,
      o.max_bytes,
      o.step_factor > 1 ? fmt::format("{}(factor)", o.step_factor) : fmt::format("{}(bytes)", o.step_bytes),
      o.warmup, o.iters, o.check ? 1 : 0);
  out << fmt::format(
      "# time over ranks: {} (-a {}); spread: {} iterations timed one by one, min/max over ranks, p50/p99 "
      "the ranks' {}{}\n",
      average_name(o.average), o.average, o.iters, average_name(o.average),
      o.size_timeout_s > 0 ? fmt::format("; --timeout {} s per size", o.size_timeout_s) : std::string());
  // hier and auto: which algorithm the largest size runs with, and why (Note [Two-level cost model]).
  if (o.impl == Algorithm::hier || o.impl == Algorithm::automatic)
    out << fmt::format("# {}\n", comm.explain(kind, size_t(o.max_bytes)));
  out << "#\n# Using devices\n";
  for (int r = 0; r < world.size(); ++r)
    out << fmt::format("#  Rank {:>2} Pid {:>7} on {:>10} device {}\n", r, world.peer(r).pid,
                       world.peer(r).host,
                       device.is_cuda() ? fmt::format("cuda (GPU of local rank)") : std::string("cpu"));
  out << "#\n";
  out << "#                                                              out-of-place                      "
         " "
         "in-place           out-of-place spread\n";
  out << "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
         "algbw "
         "  busbw #wrong      min      p50      p99      max\n";
  out << "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
         "(GB/s) "
         " (GB/s)             (us)     (us)     (us)     (us)\n";
  out.flush();
}

// One size, out-of-place and in-place, under --timeout's deadline: a size that runs past it is a CommError
// naming the size.
std::pair<Placement, Placement> run_size(CollectiveBench& bench, int64_t count, const CommBenchOptions& o,
                                         World& world, Communicator& comm, Communicator& ctl) {
  SizeDeadline deadline(o.size_timeout_s, {&comm, &ctl});
  try {
    return bench.run(count);
  } catch (const CommError& e) {
    if (!deadline.fired()) throw;
    throw CommError(fmt::format("commbench: {} of {} bytes ran past --timeout {} s on rank {}; aborted ({})",
                                name(bench.kind()), count * int64_t(dtype_size(o.dtype)), o.size_timeout_s,
                                world.rank(), e.what()));
  }
}

nlohmann::ordered_json placement_json(const Placement& p) {
  nlohmann::ordered_json j;
  j["time_us"] = p.time_us;
  j["algbw_GBps"] = p.algbw;
  j["busbw_GBps"] = p.busbw;
  j["wrong"] = p.wrong < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(p.wrong);
  j.update(spread_json(p.spread));
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const RankFigures& f : p.ranks)
    ranks.push_back(
        {{"time_us", f[0]}, {"min_us", f[1]}, {"p50_us", f[2]}, {"p99_us", f[3]}, {"max_us", f[4]}});
  j["ranks"] = std::move(ranks);
  return j;
}

nlohmann::ordered_json row_json(int64_t size, int64_t count, const RowLabels& l, const Placement& oop,
                                const Placement& ip) {
  nlohmann::ordered_json row;
  row["size"] = size;
  row["count"] = count;
  row["type"] = l.type;
  row["redop"] = l.redop;
  row["root"] = l.root;
  row["out_of_place"] = placement_json(oop);
  row["in_place"] = placement_json(ip);
  // The out-of-place spread at the row's top level too, as the table shows it.
  row.update(spread_json(oop.spread));
  return row;
}

// One row of the table, and with --per-rank each rank's figures under it.
void print_row(int64_t size, int64_t count, const RowLabels& l, const Placement& oop, const Placement& ip,
               bool per_rank, std::ostream& out) {
  auto cols = [](const Placement& p) {
    return fmt::format("  {}  {}  {}  {:>5}", num(p.time_us, 7), num(p.algbw, 6), num(p.busbw, 6),
                       p.wrong < 0 ? std::string("N/A") : std::to_string(p.wrong));
  };
  const TimeSpread& sp = oop.spread;
  out << fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", size, count, l.type, l.redop, l.root) << cols(oop)
      << cols(ip)
      << fmt::format(" {} {} {} {}", num(sp.min_us, 8), num(sp.p50_us, 8), num(sp.p99_us, 8),
                     num(sp.max_us, 8))
      << "\n";
  if (per_rank) {
    for (size_t q = 0; q < oop.ranks.size(); ++q) {
      const RankFigures &a = oop.ranks[q], &b = ip.ranks[q];
      out << fmt::format(
          "#  rank {:>3}: out-of-place time {} min {} p50 {} p99 {} max {}; in-place time {} min {} p50 "
          "{} "
          "p99 {} max {}\n",
          q, num(a[0], 8), num(a[1], 8), num(a[2], 8), num(a[3], 8), num(a[4], 8), num(b[0], 8), num(b[1], 8),
          num(b[2], 8), num(b[3], 8), num(b[4], 8));
    }
  }
  out.flush();
}

// --json's document: the run's settings, the machine, every size's row and the totals.
nlohmann::ordered_json run_json(const CommBenchOptions& o, World& world, Collective kind, Backend backend,
                                Communicator& comm, nlohmann::ordered_json machine,
                                nlohmann::ordered_json rows, int64_t total_wrong, double avg_bw) {
  nlohmann::ordered_json doc;
  doc["op"] = name(kind);
  doc["impl"] = name(o.impl);
  doc["backend"] = name(backend);
  doc["device"] = o.device;
  doc["ranks"] = world.size();
  doc["ring"] = comm.ring();
  doc["choice"] = comm.explain(kind, size_t(o.max_bytes));
  doc["warmup"] = o.warmup;
  doc["iters"] = o.iters;
  doc["average"] = average_name(o.average);
  doc["timeout_s"] = o.size_timeout_s;
  doc["machine"] = std::move(machine);
  doc["results"] = std::move(rows);
  doc["wrong"] = total_wrong;
  doc["avg_busbw_GBps"] = avg_bw;
  return doc;
}

// The collectives' table (or --json): every size from -b to -e on the measured communicator.
int run_collective_bench(World& world, const CommBenchOptions& o, std::ostream& out) {
  const bool root_prints = world.rank() == 0;
  const Device device = parse_device(o.device);
  const CommOptions co = measured_comm_options(o, device);
  auto comm = make_communicator(world, co);
  CommOptions cc;
  cc.timeout_s = o.timeout_s;
  auto ctl = make_communicator(world, cc);  // for timings and counts, off the measured communicator
  CollectiveBench bench(world, o, *comm, *ctl);
  const Collective kind = bench.kind();
  const RowLabels labels{bench_dtype_name(o.dtype), bench.reduces() ? std::string(name(o.redop)) : "none",
                         kind == Collective::broadcast ? o.root : -1};
  CZ_CHECK(o.average >= 0 && o.average <= 3,
           "commbench: -a takes 0 (rank 0), 1 (mean), 2 (min) or 3 (max), not {}", o.average);
  nlohmann::ordered_json machine;
  if (o.json) machine = machine_facts(world);  // collective: every rank

  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (root_prints && !o.json) print_table_header(o, world, kind, co.backend, *comm, device, out);
  int64_t total_wrong = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (int64_t bytes : sizes(o)) {
    const int64_t count = bytes / int64_t(dtype_size(o.dtype));
    if (count == 0) continue;
    const auto [oop, ip] = run_size(bench, count, o, world, *comm, *ctl);
    total_wrong += std::max<int64_t>(oop.wrong, 0) + std::max<int64_t>(ip.wrong, 0);
    bw_sum += oop.busbw + ip.busbw;
    bw_count += 2;
    if (!root_prints) continue;
    const int64_t size = count * int64_t(dtype_size(o.dtype));
    if (o.json)
      rows.push_back(row_json(size, count, labels, oop, ip));
    else
      print_row(size, count, labels, oop, ip, o.per_rank, out);
  }
  const double avg_bw = bw_count ? bw_sum / bw_count : 0;
  if (root_prints) {
    if (o.json) {
      out << run_json(o, world, kind, co.backend, *comm, std::move(machine), std::move(rows), total_wrong,
                      avg_bw)
                 .dump(1)
          << "\n";
    } else {
      out << fmt::format("# Out of bounds values : {} {}\n", total_wrong, total_wrong ? "FAILED" : "OK");
      out << fmt::format("# Avg bus bandwidth    : {:.4g}\n#\n", avg_bw);
    }
  }
  return total_wrong ? 1 : 0;
}

}  // namespace

int run_commbench(World& world, const CommBenchOptions& o, std::ostream& out) {
  if (!o.topo_file.empty() || o.show_ring || o.show_topology) {
    const bool root_prints = world.rank() == 0;
    const Topology topo = o.topo_file.empty() ? detect_topology(world) : Topology::load(o.topo_file);
    if (root_prints && o.show_topology) out << topo.to_json_string();
    if (root_prints && o.show_ring) print_ring_report(topo, out);
    return 0;
  }
  if (o.check_p2p) return run_p2p_check(world, o, out);
  if (o.op == "sendrecv") return run_p2p_bench(world, o, out);
  if (o.op == "copy") return run_copy_bench(world, o, out);
  if (o.op == "quant_all_gather") return run_quant_bench(world, o, out);
  if (o.op == "quant_reduce_scatter") return run_quant_reduce_scatter_bench(world, o, out);
  return run_collective_bench(world, o, out);
}

}  // namespace cz::dist
