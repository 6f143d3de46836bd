// commbench --op sendrecv and --check-p2p: every ordered pair of ranks in turn (the others wait at a
// barrier), through the measured communicator's send and recv, on CPU or GPU buffers. Bandwidth as OSU's
// osu_bw defines it (a window of back-to-back non-blocking sends, then a short acknowledgement; bytes x
// window / time), latency as osu_latency does (half of a ping-pong's round trip); on GPUs also the devices'
// peer copy matrix (commbench_p2p_cuda.cpp). --check-p2p sends known bytes and names the pairs that got
// others.
#include <chrono>
#include <cstdlib>
#include <ostream>

#include <fmt/format.h>

#include "dist/comm/bootstrap.h"
#include "dist/commbench/bench_internal.h"
#include "dist/commbench/commbench.h"
#include "tensor/check.h"

namespace cz::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct P2pComms {
  std::unique_ptr<Communicator> comm, ctl;
  Device device;
  Backend backend;
};

P2pComms open_comms(World& world, const CommBenchOptions& o, const char* what) {
  CZ_CHECK(world.size() >= 2, "commbench {} needs at least 2 ranks, not {}", what, world.size());
  CZ_CHECK(o.min_bytes > 0 && o.max_bytes >= o.min_bytes, "commbench: need 0 < -b ({}) <= -e ({})",
           o.min_bytes, o.max_bytes);
  CZ_CHECK(o.window >= 1, "commbench: --window must be at least 1, not {}", o.window);
  P2pComms c;
  c.device = parse_device(o.device);
  CommOptions co;
  co.backend =
      o.backend.empty() ? (c.device.is_cuda() ? Backend::nccl : Backend::mpi) : parse_backend(o.backend);
  co.algorithm = o.impl;
  co.device = c.device;
  co.timeout_s = o.timeout_s;
  c.backend = co.backend;
  c.comm = make_communicator(world, co);
  CommOptions cc;
  cc.timeout_s = o.timeout_s;
  c.ctl = make_communicator(world, cc);
  return c;
}

std::vector<int64_t> p2p_sizes(const CommBenchOptions& o) {
  std::vector<int64_t> out;
  for (double b = double(o.min_bytes); b <= double(o.max_bytes) + 0.5;
       b = o.step_factor > 1 ? b * o.step_factor : b + double(std::max<int64_t>(o.step_bytes, 1)))
    out.push_back(int64_t(b));
  return out;
}

// The byte `from` sends `to` at index i of check round `rep`: it differs between pairs, positions and rounds,
// so zeros, a stale buffer, a shifted copy or another pair's data read as wrong.
uint8_t pattern(int from, int to, int64_t i, int rep) {
  return uint8_t((i * 131 + (i >> 8) * 7 + from * 31 + to * 17 + rep * 101 + 1) & 0xff);
}

// Runs `body` for every ordered pair, one pair at a time, under the deadline of one size.
template <class Body>
void each_pair(P2pComms& c, int n, double timeout_s, const std::string& what, int me, Body body) {
  SizeDeadline deadline(timeout_s, {c.comm.get(), c.ctl.get()});
  try {
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        if (a == b) continue;
        c.ctl->barrier()->wait();
        body(a, b);
      }
    c.ctl->barrier()->wait();
  } catch (const CommError& e) {
    if (!deadline.fired()) throw;
    throw CommError(fmt::format("commbench: {} ran past --timeout {} s on rank {}; aborted ({})", what,
                                timeout_s, me, e.what()));
  }
}

std::vector<double> gather_rows(Communicator& ctl, const std::vector<double>& mine, int n) {
  std::vector<double> all(mine.size() * size_t(n));
  ctl.all_gather(mine.data(), all.data(), int64_t(all.size()), DType::f64, Device::cpu())->wait();
  return all;
}

}  // namespace

void print_matrix(std::ostream& out, const std::vector<double>& m, int n, int width) {
  out << fmt::format("{:>{}}", "from\\to", 9);
  for (int b = 0; b < n; ++b) out << fmt::format(" {:>{}}", b, width);
  out << "\n";
  for (int a = 0; a < n; ++a) {
    out << fmt::format("{:>9}", a);
    for (int b = 0; b < n; ++b)
      out << (a == b ? fmt::format(" {:>{}}", "-", width)
                     : fmt::format(" {:>{}.4g}", m[size_t(a * n + b)], width));
    out << "\n";
  }
}

nlohmann::ordered_json matrix_json(const std::vector<double>& m, int n) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int a = 0; a < n; ++a) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (int b = 0; b < n; ++b)
      row.push_back(a == b ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(m[size_t(a * n + b)]));
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {

// One size's buffers for timing a pair: what is sent, what is received, and the acknowledgement byte.
struct PairBuffers {
  BenchBuffer send, recv, ack;
};

// Rank `me`'s part in timing the pair a -> b at `bytes` (nothing unless it is a or b): osu_bw's windows, then
// osu_latency's ping-pongs. The sender writes the pair's bandwidth (GB/s) at mine[b] and its latency (us) at
// mine[n + b].
void time_pair(Communicator& comm, Device dev, PairBuffers& buf, const CommBenchOptions& o, int64_t bytes,
               int n, int me, int a, int b, std::vector<double>& mine) {
  if (me != a && me != b) return;
  const int peer = me == a ? b : a;
  auto window = [&] {
    std::vector<WorkHandle> w;
    w.reserve(size_t(o.window));
    for (int k = 0; k < o.window; ++k)
      w.push_back(me == a ? comm.send(buf.send.data(), bytes, DType::u8, dev, peer)
                          : comm.recv(buf.recv.data(), bytes, DType::u8, dev, peer));
    for (auto& h : w) h->synchronize();
    if (me == a)
      comm.recv(buf.ack.data(), 1, DType::u8, dev, peer)->synchronize();
    else
      comm.send(buf.ack.data(), 1, DType::u8, dev, peer)->synchronize();
  };
  auto ping_pong = [&] {
    if (me == a) {
      comm.send(buf.send.data(), bytes, DType::u8, dev, peer)->synchronize();
      comm.recv(buf.recv.data(), bytes, DType::u8, dev, peer)->synchronize();
    } else {
      comm.recv(buf.recv.data(), bytes, DType::u8, dev, peer)->synchronize();
      comm.send(buf.send.data(), bytes, DType::u8, dev, peer)->synchronize();
    }
  };
  const int iters = std::max(1, o.iters);
  for (int i = 0; i < o.warmup; ++i) window();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) window();
  const double bw_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int i = 0; i < o.warmup; ++i) ping_pong();
  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) ping_pong();
  const double pp_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (me == a) {
    mine[size_t(b)] = double(bytes) * o.window * iters / bw_s / 1e9;
    mine[size_t(n + b)] = pp_s / (2.0 * iters) * 1e6;
  }
}

// One size's pair matrices (row: sender) from every rank's row of bandwidths then latencies.
struct PairMatrices {
  std::vector<double> bandwidth, latency;
};
PairMatrices pair_matrices(const std::vector<double>& all, int n) {
  PairMatrices m{std::vector<double>(size_t(n * n)), std::vector<double>(size_t(n * n))};
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      m.bandwidth[size_t(a * n + b)] = all[size_t(a * 2 * n + b)];
      m.latency[size_t(a * n + b)] = all[size_t(a * 2 * n + n + b)];
    }
  return m;
}

// On GPUs: the peer copy matrix of rank 0's host, as CUDA's p2pBandwidthLatencyTest prints it (printed unless
// --json; the JSON either way, or its note where there is none).
nlohmann::ordered_json peer_copies(const CommBenchOptions& o, std::ostream& out) {
  std::string note;
  nlohmann::ordered_json peer =
      cuda_peer_matrix(o.max_bytes, std::max(1, o.iters), o.json ? nullptr : &out, &note);
  if (!note.empty() && !o.json) out << "# peer copies: " << note << "\n";
  if (peer.is_null() && !note.empty()) peer = {{"note", note}};
  return peer;
}

}  // namespace

int run_p2p_bench(World& world, const CommBenchOptions& o, std::ostream& out) {
  P2pComms c = open_comms(world, o, "--op sendrecv");
  const int n = world.size(), me = world.rank();
  const bool print = me == 0;
  nlohmann::ordered_json machine;
  if (o.json) machine = machine_facts(world);
  const Device dev = c.device;
  if (print && !o.json)
    out << fmt::format(
        "# commbench sendrecv: backend {}, device {}, {} ranks, every ordered pair in turn; warmup {} iters "
        "{}\n"
        "# bandwidth as osu_bw: a window of {} back-to-back sends, then a 1-byte acknowledgement; bytes x {} "
        "/ "
        "time\n# latency as osu_latency: half of a ping-pong's round trip\n",
        name(c.backend), o.device, n, o.warmup, o.iters, o.window, o.window);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const int64_t bytes : p2p_sizes(o)) {
    PairBuffers buf{BenchBuffer(dev, size_t(bytes)), BenchBuffer(dev, size_t(bytes)), BenchBuffer(dev, 1)};
    std::vector<double> mine(size_t(2 * n), 0.0);  // bandwidth (GB/s) then latency (us) to each peer
    each_pair(c, n, o.size_timeout_s, fmt::format("sendrecv of {} bytes", bytes), me,
              [&](int a, int b) { time_pair(*c.comm, dev, buf, o, bytes, n, me, a, b, mine); });
    const PairMatrices m = pair_matrices(gather_rows(*c.ctl, mine, n), n);
    if (!print) continue;
    if (o.json) {
      results.push_back({{"size", bytes},
                         {"window", o.window},
                         {"bandwidth_GBps", matrix_json(m.bandwidth, n)},
                         {"latency_us", matrix_json(m.latency, n)}});
    } else {
      out << fmt::format("#\n# {} bytes: bandwidth (GB/s), row: sender\n", bytes);
      print_matrix(out, m.bandwidth, n, 9);
      out << fmt::format("# {} bytes: latency (us)\n", bytes);
      print_matrix(out, m.latency, n, 9);
      out.flush();
    }
  }
  nlohmann::ordered_json peer;
  if (dev.is_cuda() && print) peer = peer_copies(o, out);
  if (print && o.json) {
    nlohmann::ordered_json doc;
    doc["op"] = "sendrecv";
    doc["backend"] = name(c.backend);
    doc["device"] = o.device;
    doc["ranks"] = n;
    doc["warmup"] = o.warmup;
    doc["iters"] = o.iters;
    doc["timeout_s"] = o.size_timeout_s;
    doc["machine"] = std::move(machine);
    doc["results"] = std::move(results);
    if (dev.is_cuda()) doc["peer_copies"] = std::move(peer);
    out << doc.dump(1) << "\n";
  }
  return 0;
}

namespace {

// Per sender, as --check-p2p gathers them: wrong bytes, the first wrong index, what it held and what it
// should have.
constexpr int kCheckFields = 4;

// CZ_COMMBENCH_CORRUPT=A:B (a test hook, as CZ_SIMULATE_HOSTS is one): rank B flips a byte of what it
// received from A before checking it, standing in for a transport that returns wrong bytes. {-1, -1}: unset.
std::pair<int, int> corrupt_pair() {
  int from = -1, to = -1;
  if (const char* env = std::getenv("CZ_COMMBENCH_CORRUPT"); env && *env)
    CZ_CHECK(std::sscanf(env, "%d:%d", &from, &to) == 2, "CZ_COMMBENCH_CORRUPT takes FROM:TO ranks, not '{}'",
             env);
  return {from, to};
}

// Rank `me`'s part in checking the pair a -> b at `bytes` in round `rep`: a sends the pattern; b receives
// over the pattern's complement and writes what it found at mine[kCheckFields * a].
void check_pair(Communicator& comm, Device dev, BenchBuffer& buf, int64_t bytes, int rep,
                std::pair<int, int> corrupt, int me, int a, int b, std::vector<double>& mine) {
  if (me == a) {
    for (int64_t i = 0; i < bytes; ++i) buf.host()[i] = char(pattern(a, b, i, rep));
    buf.upload();
    comm.send(buf.data(), bytes, DType::u8, dev, b)->synchronize();
  } else if (me == b) {
    for (int64_t i = 0; i < bytes; ++i) buf.host()[i] = char(~pattern(a, b, i, rep));
    buf.upload();
    comm.recv(buf.data(), bytes, DType::u8, dev, a)->synchronize();
    buf.download();
    if (a == corrupt.first && b == corrupt.second) buf.host()[bytes / 2] ^= 0x5a;
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < bytes; ++i)
      if (uint8_t(buf.host()[i]) != pattern(a, b, i, rep)) {
        if (first < 0) first = i;
        ++wrong;
      }
    double* f = &mine[size_t(kCheckFields * a)];
    f[0] = double(wrong);
    f[1] = double(first);
    f[2] = first >= 0 ? double(uint8_t(buf.host()[first])) : 0;
    f[3] = first >= 0 ? double(pattern(a, b, first, rep)) : 0;
  }
}

// The pairs that got wrong bytes at `bytes`, from every receiver's row.
void add_pair_failures(World& world, const std::vector<double>& all, int64_t bytes,
                       std::vector<std::string>& failures) {
  const int n = world.size();
  for (int b = 0; b < n; ++b)
    for (int a = 0; a < n; ++a) {
      const double* f = &all[size_t(b * kCheckFields * n + kCheckFields * a)];
      if (a == b || f[0] == 0) continue;
      failures.push_back(
          fmt::format("rank {} ({}) -> rank {} ({}): {} of {} bytes wrong, first at byte {} (0x{:02x}, "
                      "expected 0x{:02x})",
                      a, world.peer(a).host, b, world.peer(b).host, int64_t(f[0]), bytes, int64_t(f[1]),
                      int(f[2]), int(f[3])));
    }
}

}  // namespace

int run_p2p_check(World& world, const CommBenchOptions& o, std::ostream& out) {
  P2pComms c = open_comms(world, o, "--check-p2p");
  const int n = world.size(), me = world.rank();
  const bool print = me == 0;
  nlohmann::ordered_json machine;
  if (o.json) machine = machine_facts(world);
  const std::pair<int, int> corrupt = corrupt_pair();
  const Device dev = c.device;
  const std::vector<int64_t> sizes = p2p_sizes(o);
  if (print && !o.json)
    out << fmt::format(
        "# commbench --check-p2p: backend {}, device {}, {} ranks: known bytes through send/recv between "
        "every "
        "ordered pair, at {} size(s) from {} to {} bytes\n",
        name(c.backend), o.device, n, sizes.size(), o.min_bytes, o.max_bytes);
  std::vector<std::string> failures;
  int64_t checked_pairs = 0;
  int rep = 0;
  for (const int64_t bytes : sizes) {
    ++rep;
    BenchBuffer buf(dev, size_t(bytes));
    std::vector<double> mine(size_t(kCheckFields * n), 0.0);
    each_pair(c, n, o.size_timeout_s, fmt::format("--check-p2p at {} bytes", bytes), me,
              [&](int a, int b) { check_pair(*c.comm, dev, buf, bytes, rep, corrupt, me, a, b, mine); });
    checked_pairs += int64_t(n) * (n - 1);
    add_pair_failures(world, gather_rows(*c.ctl, mine, n), bytes, failures);
  }
  // On GPUs: the same between the devices rank 0's process sees, by peer copies, with and without peer
  // access.
  std::string peer_note;
  if (dev.is_cuda() && print)
    for (std::string& f : cuda_peer_check(o.max_bytes, &peer_note)) failures.push_back("peer copy " + f);
  if (print) {
    if (o.json) {
      nlohmann::ordered_json doc;
      doc["op"] = "check_p2p";
      doc["backend"] = name(c.backend);
      doc["device"] = o.device;
      doc["ranks"] = n;
      doc["sizes"] = sizes;
      doc["pairs_checked"] = checked_pairs;
      doc["failures"] = failures;
      if (!peer_note.empty()) doc["peer_copies_note"] = peer_note;
      doc["ok"] = failures.empty();
      doc["machine"] = std::move(machine);
      out << doc.dump(1) << "\n";
    } else {
      for (const std::string& f : failures) out << "# WRONG: " << f << "\n";
      if (!peer_note.empty()) out << "# peer copies: " << peer_note << "\n";
      out << fmt::format("# check-p2p: {} pair transfers, {} wrong: {}\n", checked_pairs, failures.size(),
                         failures.empty() ? "OK" : "FAILED");
    }
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace cz::dist
