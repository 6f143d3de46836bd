// Collectives against a reference computed locally: every op x algorithm x dtype x reduction x placement,
// over odd counts (including fewer elements than ranks), on 2 and 4 ranks (ctest runs it under mpirun). Plus
// asynchronous use, point to point, custom ring orders, the Tensor forms and argument errors. The two-level
// (hier) and automatic communicators run the same reference under $CZ_SIMULATE_HOSTS (ctest's dist_hier_*).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/comm/mesh.h"
#include "dist/comm/process_group.h"
#include "tensor/element_value.h"
#include "tensor/tensor.h"

namespace cz::dist {
namespace {

// Communicators shared by the tests (creating one is collective).
struct Comms : ::testing::Environment {
  static inline std::unique_ptr<Communicator> builtin, ring, ring_small, ring_custom, hier, automatic;
  void SetUp() override {
    World& w = World::get();
    CommOptions o;
    o.timeout_s = 120;
    builtin = make_communicator(w, o);
    o.algorithm = Algorithm::ring;
    ring = make_communicator(w, o);
    o.slice_bytes = 256;  // many slices: exercises the pipeline and the tags
    ring_small = make_communicator(w, o);
    o.slice_bytes = 4096;
    // A ring order that is not rank order: odd ranks first, reversed.
    for (int r = w.size() - 1; r >= 0; r -= 2) o.ring.push_back(r);
    for (int r = w.size() - 2; r >= 0; r -= 2) o.ring.push_back(r);
    ring_custom = make_communicator(w, o);
    CommOptions h;
    h.timeout_s = 120;
    h.algorithm = Algorithm::hier;
    hier = make_communicator(w, h);
    h.algorithm = Algorithm::automatic;
    automatic = make_communicator(w, h);
  }
  void TearDown() override {
    builtin.reset();
    ring.reset();
    ring_small.reset();
    ring_custom.reset();
    hier.reset();
    automatic.reset();
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new Comms);

enum class Which { builtin, ring, ring_small, ring_custom, hier, automatic };
Communicator& comm(Which w) {
  switch (w) {
    case Which::builtin:
      return *Comms::builtin;
    case Which::ring:
      return *Comms::ring;
    case Which::ring_small:
      return *Comms::ring_small;
    case Which::hier:
      return *Comms::hier;
    case Which::automatic:
      return *Comms::automatic;
    default:
      return *Comms::ring_custom;
  }
}
const char* which_name(Which w) {
  const char* names[] = {"builtin", "ring", "ring_small", "ring_custom", "hier", "auto"};
  return names[int(w)];
}

// Random in [-1, 1], at least 1/16 away from zero; the same on every rank for (rank, index, seed).
double input(int rank, int64_t i, uint64_t seed) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + uint64_t(rank) * 0xbf58476d1ce4e5b9ull + uint64_t(i) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const double u = double(z >> 11) * 0x1p-53;  // [0, 1)
  const double mag = 1.0 / 16 + u * (15.0 / 16);
  return (z & 1) ? mag : -mag;
}

// What `v` becomes when stored in `dt`.
double rounded(DType dt, double v) {
  char buf[8];
  store_element(dt, buf, 0, v);
  return load_element(dt, buf, 0);
}
double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::f64:
      return 0x1p-53;
    case DType::f32:
      return 0x1p-24;
    case DType::f16:
      return 0x1p-11;
    default:
      return 0x1p-8;
  }
}

struct Case {
  Collective kind;
  Which which;
  DType dtype;
  ReduceOp op;
  bool in_place;
};

std::string describe(const Case& c) {
  std::string s =
      std::string(name(c.kind)) + "_" + which_name(c.which) + "_" + std::string(dtype_name(c.dtype));
  if (c.kind == Collective::all_reduce || c.kind == Collective::reduce_scatter)
    s += "_" + std::string(name(c.op));
  return s + (c.in_place ? "_inplace" : "_outofplace");
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return describe(info.param);
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << describe(c);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Collective k :
       {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather, Collective::broadcast})
    for (Which w : {Which::builtin, Which::ring, Which::ring_small, Which::ring_custom})
      for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          const bool reduces = k == Collective::all_reduce || k == Collective::reduce_scatter;
          if (!reduces && op == ReduceOp::avg) continue;
          for (bool in_place : {false, true}) cases.push_back({k, w, dt, op, in_place});
        }
  // Two levels (Note [Two-level collectives]); auto mixes them with the ring by size, f32 is enough for it.
  for (Collective k : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather})
    for (Which w : {Which::hier, Which::automatic})
      for (DType dt : {DType::f32, DType::f16, DType::bf16})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          if (k == Collective::all_gather && op == ReduceOp::avg) continue;
          if (w == Which::automatic && dt != DType::f32) continue;
          for (bool in_place : {false, true}) cases.push_back({k, w, dt, op, in_place});
        }
  return cases;
}

// Runs one collective on `count` elements and checks every output element; returns the number of bad ones.
int64_t run_and_check(Communicator& c, const Case& cs, int64_t count, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const DType dt = cs.dtype;
  const size_t es = dtype_size(dt);
  const int64_t shard = shard_count(count, n, me), off = shard_offset(count, n, me);
  const int root = n - 1;
  const bool reduces = cs.kind == Collective::all_reduce || cs.kind == Collective::reduce_scatter;
  const int64_t in_elems = cs.kind == Collective::all_gather ? shard : count;
  const int64_t out_elems = cs.kind == Collective::reduce_scatter ? shard : count;
  constexpr double kSentinel = 1000.0;

  std::vector<char> a(size_t(std::max<int64_t>(count, 1)) * es), b(size_t(std::max<int64_t>(count, 1)) * es);
  for (int64_t i = 0; i < count; ++i) store_element(dt, b.data(), i, kSentinel);
  char* send = a.data();
  char* recv = b.data();
  if (cs.in_place) {
    send = recv = b.data();
    if (cs.kind == Collective::reduce_scatter) recv = b.data() + size_t(off) * es;
    if (cs.kind == Collective::all_gather) send = b.data() + size_t(off) * es;
  }
  const int64_t first = cs.kind == Collective::all_gather ? off : 0;
  const int src_rank = cs.kind == Collective::broadcast ? root : me;
  for (int64_t i = 0; i < in_elems; ++i)
    store_element(
        dt, send, i,
        cs.kind == Collective::broadcast && me != root ? -kSentinel : input(src_rank, first + i, seed));

  WorkHandle work;
  switch (cs.kind) {
    case Collective::all_reduce:
      work = c.all_reduce(send, recv, count, dt, Device::cpu(), cs.op);
      break;
    case Collective::reduce_scatter:
      work = c.reduce_scatter(send, recv, count, dt, Device::cpu(), cs.op);
      break;
    case Collective::all_gather:
      work = c.all_gather(send, recv, count, dt, Device::cpu());
      break;
    default:
      work = c.broadcast(send, recv, count, dt, Device::cpu(), root);
  }
  work->wait();
  EXPECT_TRUE(work->is_completed());

  const int64_t out_first = cs.kind == Collective::reduce_scatter ? off : 0;
  int64_t bad = 0;
  for (int64_t k = 0; k < out_elems; ++k) {
    const int64_t i = out_first + k;
    double want = 0, scale = 0;
    if (reduces) {
      for (int q = 0; q < n; ++q) {
        const double v = rounded(dt, input(q, i, seed));
        want += v;
        scale += std::fabs(v);
      }
      if (cs.op == ReduceOp::avg) want /= n, scale /= n;
    } else {
      int owner = root;
      if (cs.kind == Collective::all_gather) {
        owner = 0;
        while (owner + 1 < n && shard_offset(count, n, owner + 1) <= i) ++owner;
      }
      want = rounded(dt, input(owner, i, seed));
    }
    const double got = load_element(dt, recv, k);
    // Reductions round once per ring step (16-bit partial sums) plus once at the end.
    const double tol = reduces ? 2.0 * (n + 1) * unit_roundoff(dt) * scale + 1e-300 : 0.0;
    if (!(std::fabs(got - want) <= tol)) {
      if (bad == 0)
        ADD_FAILURE() << "rank " << me << ": " << name(cs.kind) << " count " << count << " element " << i
                      << ": got " << got << ", want " << want << " (tolerance " << tol << ")";
      ++bad;
    }
  }
  return bad;
}

class CollectiveTest : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveTest, MatchesLocalReference) {
  const Case& cs = GetParam();
  Communicator& c = comm(cs.which);
  const int n = c.size();
  std::vector<int64_t> counts = {0, 1, 2, 3, 5, 7, int64_t(n) - 1, int64_t(n) + 1, 31, 1000, 4099};
  if (cs.which != Which::ring_small) counts.insert(counts.end(), {65537, 200003});
  // Two-level calls of several MiB go in pieces (Note [Two-level pipeline]).
  if (cs.which == Which::hier) counts.push_back(1500007);
  uint64_t seed = 1;
  for (int64_t count : counts) {
    if (count < 0) continue;
    EXPECT_EQ(run_and_check(c, cs, count, seed++), 0) << "count " << count;
  }
}

INSTANTIATE_TEST_SUITE_P(All, CollectiveTest, ::testing::ValuesIn(all_cases()), case_name);

TEST(Collectives, ManyInFlightCompleteInAnyWaitOrder) {
  Communicator& c = *Comms::ring;
  const int n = c.size();
  constexpr int kCalls = 6;
  constexpr int64_t kCount = 10007;
  std::vector<std::vector<float>> bufs(kCalls, std::vector<float>(kCount));
  for (int k = 0; k < kCalls; ++k)
    for (int64_t i = 0; i < kCount; ++i) bufs[size_t(k)][size_t(i)] = float(c.rank() + 1) * float(k + 1);
  std::vector<WorkHandle> works;
  for (int k = 0; k < kCalls; ++k)
    works.push_back(c.all_reduce(bufs[size_t(k)].data(), bufs[size_t(k)].data(), kCount, DType::f32,
                                 Device::cpu(), ReduceOp::sum));
  for (int k = kCalls - 1; k >= 0; --k) works[size_t(k)]->wait();
  const float ranks_sum = float(n * (n + 1) / 2);
  for (int k = 0; k < kCalls; ++k) {
    EXPECT_EQ(bufs[size_t(k)].front(), ranks_sum * float(k + 1));
    EXPECT_EQ(bufs[size_t(k)].back(), ranks_sum * float(k + 1));
  }
}

TEST(Collectives, SendRecvAroundTheRingAndPairwise) {
  for (Communicator* c : {Comms::builtin.get(), Comms::ring.get()}) {
    const int n = c->size(), me = c->rank();
    if (n < 2) GTEST_SKIP() << "needs 2 ranks";
    // Everyone sends to the next rank and receives from the previous one, both started before either waits.
    std::vector<double> out(70001, double(me)), in(70001, -1.0);
    auto r = c->recv(in.data(), int64_t(in.size()), DType::f64, Device::cpu(), (me + n - 1) % n);
    auto s = c->send(out.data(), int64_t(out.size()), DType::f64, Device::cpu(), (me + 1) % n);
    s->wait();
    r->wait();
    EXPECT_EQ(in.front(), double((me + n - 1) % n));
    EXPECT_EQ(in.back(), double((me + n - 1) % n));
    // Pairs exchange with send called first on both sides: must not deadlock.
    const int partner = me ^ 1;
    if (partner < n) {
      std::vector<float> mine(300000, float(me)), theirs(300000, -1.f);
      auto s2 = c->send(mine.data(), int64_t(mine.size()), DType::f32, Device::cpu(), partner);
      auto r2 = c->recv(theirs.data(), int64_t(theirs.size()), DType::f32, Device::cpu(), partner);
      r2->wait();
      s2->wait();
      EXPECT_EQ(theirs[12345], float(partner));
    }
    c->barrier()->wait();
  }
}

TEST(Collectives, TensorForms) {
  Communicator& c = *Comms::ring;
  const int n = c.size(), me = c.rank();
  Tensor t = full({3, 5}, double(me + 1));
  c.all_reduce(t, ReduceOp::avg)->wait();
  EXPECT_DOUBLE_EQ(t.to_vector<float>()[7], (n + 1) / 2.0);

  Tensor in = full({13}, 2.0);
  Tensor shard = empty({shard_count(13, n, me)});
  c.reduce_scatter(in, shard)->wait();
  for (float v : shard.to_vector<float>()) EXPECT_EQ(v, 2.0f * float(n));

  Tensor out = zeros({13}, DType::f64);
  Tensor mine = full({shard_count(13, n, me)}, double(me), DType::f64);
  c.all_gather(mine, out)->wait();
  const auto got = out.to_vector<double>();
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < shard_count(13, n, r); ++k)
      EXPECT_EQ(got[size_t(shard_offset(13, n, r) + k)], double(r));

  Tensor b = full({4}, double(me), DType::bf16);
  c.broadcast(b, 0)->wait();
  for (float v : b.to_vector<float>()) EXPECT_EQ(v, 0.0f);

  Tensor wrong = empty({shard_count(13, n, me) + 1});
  EXPECT_THROW(c.reduce_scatter(in, wrong), ShapeError);
  Tensor strided = empty({4, 4}).transpose(0, 1);
  EXPECT_THROW(c.all_reduce(strided), ShapeError);
}

TEST(Collectives, RejectsBadArguments) {
  Communicator& c = *Comms::builtin;
  float x[4] = {1, 2, 3, 4};
  int32_t ints[4] = {1, 2, 3, 4};
  EXPECT_THROW(c.all_reduce(x, x, -1, DType::f32, Device::cpu(), ReduceOp::sum), ValueError);
  EXPECT_THROW(c.all_reduce(ints, ints, 4, DType::i32, Device::cpu(), ReduceOp::sum), DtypeError);
  EXPECT_THROW(c.broadcast(x, x, 4, DType::f32, Device::cpu(), c.size()), ValueError);
  EXPECT_THROW(c.send(x, 4, DType::f32, Device::cpu(), c.rank()), ValueError);
  if (!cuda_available()) {
    EXPECT_THROW(c.all_reduce(x, x, 4, DType::f32, Device::cuda(0), ReduceOp::sum), DeviceError);
  }
  // Non-reducing collectives move any dtype.
  c.broadcast(ints, ints, 4, DType::i32, Device::cpu(), 0)->wait();
  EXPECT_EQ(ints[3], 4);
}

TEST(Collectives, RingOrderIsAPermutation) {
  const auto& ring = Comms::ring_custom->ring();
  std::vector<int> sorted = ring;
  std::sort(sorted.begin(), sorted.end());
  for (int r = 0; r < int(sorted.size()); ++r) EXPECT_EQ(sorted[size_t(r)], r);
  CommOptions bad;
  bad.ring = {0, 0};
  EXPECT_THROW(make_communicator(World::get(), bad), ValueError);
}

// Note [Back-pressure]: with room for 2 calls in flight, 200 calls issued before any wait all complete,
// correctly: the caller blocks in submit() until the oldest finishes instead of queueing them all.
TEST(BackPressure, ManyMoreCallsThanRoomAllComplete) {
  CommOptions o;
  o.algorithm = Algorithm::ring;
  o.timeout_s = 120;
  o.max_in_flight = 2;
  auto c = make_communicator(World::get(), o);
  const int n = c->size();
  constexpr int kCalls = 200;
  std::vector<float> vals(kCalls);
  for (int k = 0; k < kCalls; ++k) vals[size_t(k)] = float(c->rank() + k);
  std::vector<WorkHandle> works;
  size_t most_unfinished = 0;  // after any call returned
  for (int k = 0; k < kCalls; ++k) {
    works.push_back(
        c->all_reduce(&vals[size_t(k)], &vals[size_t(k)], 1, DType::f32, Device::cpu(), ReduceOp::sum));
    size_t unfinished = 0;
    for (const auto& wk : works) unfinished += !wk->is_completed();
    most_unfinished = std::max(most_unfinished, unfinished);
  }
  EXPECT_LE(most_unfinished, 2u);
  for (int k = kCalls - 1; k >= 0; --k) works[size_t(k)]->wait();
  for (int k = 0; k < kCalls; ++k) EXPECT_EQ(vals[size_t(k)], float(n * (n - 1) / 2 + n * k)) << k;

  CommOptions bad;
  bad.max_in_flight = 0;
  EXPECT_THROW(make_communicator(World::get(), bad), ValueError);
}

// A caller blocked by a full communicator leaves with a failed Work as soon as the communicator breaks, by
// its timeout or by abort(), instead of hanging. The only slot is taken by a receive that no rank matches.
TEST(BackPressure, BlockedCallerFailsWhenTheCommunicatorBreaks) {
  World& w = World::get();
  if (w.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (bool abort : {false, true}) {
    CommOptions o;
    o.timeout_s = abort ? 120 : 1;
    o.max_in_flight = 1;
    auto c = make_communicator(w, o);
    float x = 0;
    WorkHandle unmatched = c->recv(&x, 1, DType::f32, Device::cpu(), (w.rank() + 1) % w.size());
    std::thread aborter;
    if (abort) {
      aborter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        c->abort();
      });
    }
    const auto t0 = std::chrono::steady_clock::now();
    WorkHandle blocked = c->barrier();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (aborter.joinable()) aborter.join();
    EXPECT_GE(waited, 0.25) << (abort ? "abort" : "timeout") << ": the call did not wait for room";
    EXPECT_LT(waited, 60) << (abort ? "abort" : "timeout");
    EXPECT_THROW(blocked->wait(), CommError);
    EXPECT_THROW(unmatched->wait(), CommError);
  }
}

// CUDA buffers through the MPI backend (staged) and NCCL: only where a GPU is present.
TEST(CollectivesCuda, StagedAndNcclMatchHost) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
  World& w = World::get();
  const Device dev = Device::cuda(w.gpu());
  for (Backend be : {Backend::mpi, Backend::nccl}) {
    // NCCL needs one GPU per rank.
    if (be == Backend::nccl && w.local_size() > cuda_device_count()) continue;
    for (Algorithm algo : {Algorithm::builtin, Algorithm::ring}) {
      CommOptions o;
      o.backend = be;
      o.algorithm = algo;
      o.device = dev;
      o.timeout_s = 60;
      auto c = make_communicator(w, o);
      for (int64_t count : {int64_t(1), int64_t(1001), int64_t(100003)}) {
        Tensor x = full({count}, double(w.rank() + 1)).to(dev);
        c->all_reduce(x, ReduceOp::sum)->wait();
        const auto v = x.cpu().to_vector<float>();
        EXPECT_EQ(v.front(), float(w.size() * (w.size() + 1) / 2)) << name(be) << " " << name(algo);
        Tensor shard = empty({shard_count(count, w.size(), w.rank())}, DType::f32, dev);
        c->reduce_scatter(x, shard, ReduceOp::avg)->wait();
        Tensor gathered = empty({count}, DType::f32, dev);
        c->all_gather(shard, gathered)->wait();
        EXPECT_EQ(gathered.cpu().to_vector<float>().back(), float(w.size() * (w.size() + 1) / 2));
      }
    }
  }
}

// The process group's small exchanges: every byte value survives the u8 broadcast from every root, gathered
// values come back in rank order, scalars are summed and averaged; a group of one sends nothing.
TEST(ProcessGroup, BytesValuesAndScalars) {
  World& w = World::get();
  ProcessGroup g(Comms::ring.get(), Device::cpu());
  ASSERT_EQ(g.size(), w.size());
  EXPECT_EQ(g.rank(), w.rank());
  EXPECT_EQ(g.ranks().back(), w.size() - 1);
  for (int root = 0; root < w.size(); ++root) {
    std::string bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(char(uint8_t(b + root)));
    const std::string got = g.broadcast(w.rank() == root ? bytes : std::string(), root);
    EXPECT_EQ(got, bytes) << "root " << root;
    EXPECT_EQ(g.broadcast(std::string(), root), std::string());
  }
  const std::vector<double> all = g.all_gather({double(w.rank()), 0.5});
  ASSERT_EQ(all.size(), size_t(2 * w.size()));
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(all[size_t(2 * r)], double(r));
  EXPECT_EQ(g.all_reduce(double(w.rank() + 1), ReduceOp::sum), double(w.size() * (w.size() + 1) / 2));
  EXPECT_DOUBLE_EQ(g.all_reduce(double(w.rank()), ReduceOp::avg), double(w.size() - 1) / 2);

  ProcessGroup one;
  EXPECT_EQ(one.size(), 1);
  EXPECT_EQ(one.broadcast("abc", 0), "abc");
  EXPECT_EQ(one.all_reduce(2.5, ReduceOp::sum), 2.5);
  Tensor shard = from_vector(std::vector<float>{1, 2, 3}, {3}), out = zeros({3});
  EXPECT_EQ(one.all_gather(shard, out), nullptr);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{1, 2, 3}));
}

// Note [Two-level collectives]: under $CZ_SIMULATE_HOSTS with several ranks per host, forced hier takes two
// levels at every size and says so, and auto decides per call by the cost model (a small call is
// latency-bound, and two levels cross the network in fewer steps: hier). With one host, or one rank per host,
// both are the flat ring and say why. $CZ_TOPO_FILE (ctest's dist_hier_auto_np4: a 1 Gbit/s network) makes
// auto take two levels for large calls too.
TEST(Hier, ExplainsItsChoice) {
  const HostMap hosts = host_map(World::get());
  const bool two_levels = hosts.num_hosts() > 1 && hosts.ranks_per_host() > 1;
  const std::string forced = Comms::hier->explain(Collective::reduce_scatter, 64 << 20);
  const std::string small = Comms::automatic->explain(Collective::all_reduce, 1024);
  const std::string large = Comms::automatic->explain(Collective::all_reduce, 64 << 20);
  if (two_levels) {
    EXPECT_EQ(forced.rfind("hier: as asked", 0), 0u) << forced;
    EXPECT_EQ(small.rfind("auto: hier: predicted", 0), 0u) << small;
    const char* topo = std::getenv("CZ_TOPO_FILE");
    if (topo && *topo) {
      EXPECT_EQ(large.rfind("auto: hier: predicted", 0), 0u) << large;
    }
    EXPECT_NE(Comms::hier->explain(Collective::broadcast, 64).find("flat ring"), std::string::npos);
  } else {
    const std::string why = hosts.num_hosts() == 1 ? "one host" : "one rank per host";
    EXPECT_EQ(forced, "hier: ring: " + why + ", where two levels are the flat ring");
    EXPECT_EQ(small, "auto: ring: " + why + ", where two levels are the flat ring");
    EXPECT_EQ(Comms::hier->algorithm(), Algorithm::ring);
    EXPECT_EQ(Comms::ring->explain(Collective::all_reduce, 1024), "ring");
  }
}

// Two-level calls queue on their own thread while broadcast and send/recv go to the flat ring at once; all
// complete, waited in any order, with the right values.
TEST(Hier, ManyInFlightBesideFlatCalls) {
  Communicator& c = *Comms::hier;
  const int n = c.size(), me = c.rank();
  constexpr int kCalls = 4;
  constexpr int64_t kCount = 10007;
  std::vector<std::vector<float>> bufs(kCalls, std::vector<float>(kCount));
  std::vector<float> bc(kCount, float(me)), shard(size_t(shard_count(kCount, n, me)));
  std::vector<WorkHandle> works;
  for (int k = 0; k < kCalls; ++k) {
    for (int64_t i = 0; i < kCount; ++i) bufs[size_t(k)][size_t(i)] = float(me + 1) * float(k + 1);
    works.push_back(c.all_reduce(bufs[size_t(k)].data(), bufs[size_t(k)].data(), kCount, DType::f32,
                                 Device::cpu(), ReduceOp::sum));
    if (k == 1) works.push_back(c.broadcast(bc.data(), bc.data(), kCount, DType::f32, Device::cpu(), n - 1));
  }
  works.push_back(
      c.reduce_scatter(bufs[0].data(), shard.data(), kCount, DType::f32, Device::cpu(), ReduceOp::sum));
  for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
  const float ranks_sum = float(n * (n + 1) / 2);
  for (int k = 0; k < kCalls; ++k)
    EXPECT_EQ(bufs[size_t(k)][kCount - 1], ranks_sum * float(k + 1)) << "call " << k;
  EXPECT_EQ(bc[0], float(n - 1));
  if (!shard.empty()) {
    EXPECT_EQ(shard[0], ranks_sum * float(n));
  }
  // A ring of point-to-point transfers through the two-level communicator.
  if (n > 1) {
    float out = float(me), in = -1;
    auto s = c.send(&out, 1, DType::f32, Device::cpu(), (me + 1) % n);
    auto r = c.recv(&in, 1, DType::f32, Device::cpu(), (me + n - 1) % n);
    r->wait();
    s->wait();
    EXPECT_EQ(in, float((me + n - 1) % n));
  }
}

// Note [2-D mesh]: every group of the mesh reduces over exactly its members, and names them by world rank.
// Under $CZ_SIMULATE_HOSTS=2 (ctest's dist_mesh_np4) the host and cross groups are proper subgroups too.
TEST(Mesh, GroupsReduceOverTheirMembers) {
  World& w = World::get();
  CommOptions o;
  o.timeout_s = 120;
  o.algorithm = Algorithm::ring;
  const HostMap hosts = host_map(w);
  const bool host_levels = hosts.ranks_per_host() > 0;
  for (const std::string spec : {"world", "1", "2", "host"}) {
    if (spec == "2" && w.size() % 2 != 0) continue;
    Mesh mesh(w, o, spec, host_levels);
    const auto shards = shard_groups(spec, hosts);
    const auto replicas = replicate_groups(shards);
    auto expect_group = [&](const ProcessGroup& g, const std::vector<std::vector<int>>& groups,
                            const char* what) {
      SCOPED_TRACE(fmt::format("--shard-group {}: {} group", spec, what));
      const std::vector<int>* mine = nullptr;
      for (const auto& grp : groups)
        if (std::find(grp.begin(), grp.end(), w.rank()) != grp.end()) mine = &grp;
      ASSERT_NE(mine, nullptr);
      EXPECT_EQ(g.ranks(), *mine);
      EXPECT_EQ(g.ranks()[size_t(g.rank())], w.rank());
      double sum = 0;
      for (int r : *mine) sum += r + 1;
      EXPECT_EQ(g.all_reduce(double(w.rank() + 1), ReduceOp::sum), sum);
      // A tensor all-gather in group order.
      Tensor mine_t = full({2}, double(w.rank()), DType::f32, Device::cpu());
      Tensor all = zeros({2 * int64_t(g.size())});
      if (WorkHandle h = g.all_gather(mine_t, all)) h->wait();
      const auto v = all.to_vector<float>();
      for (int i = 0; i < g.size(); ++i) EXPECT_EQ(v[size_t(2 * i + 1)], float((*mine)[size_t(i)]));
    };
    expect_group(mesh.world(), {[&] {
                   std::vector<int> all;
                   for (int r = 0; r < w.size(); ++r) all.push_back(r);
                   return all;
                 }()},
                 "world");
    expect_group(mesh.shard(), shards, "shard");
    expect_group(mesh.replicate(), replicas, "replicate");
    EXPECT_EQ(mesh.flat(), mesh.shard().size() == w.size());
    if (host_levels) {
      expect_group(mesh.host(), hosts.ranks, "host");
      expect_group(mesh.cross(), replicate_groups(hosts.ranks), "cross");
    }
  }
}

}  // namespace
}  // namespace cz::dist
