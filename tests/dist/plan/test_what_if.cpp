// The what-if model (what_if.h): its communication is the ring cost model's (Note [Ring cost model]) to the
// last bit on the test topology, its step holds exactly the engine's collectives, a profile times its own
// configuration at the measured step time, and the overlap behaves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "dist/comm/quant.h"
#include "dist/plan/what_if.h"
#include "dist/plan/zero_memory.h"
#include "dist/train/plan_request.h"
#include "plan_testing.h"
#include "tensor/check.h"

namespace cz::plan {
namespace {

using dist::Collective;

dist::Topology test_box() {
  return dist::Topology::load(std::string(CZ_DIST_TEST_DATA) + "/dual_socket_8gpu.json");
}

nlohmann::json profile() {
  std::ifstream in(std::string(CZ_PLAN_TEST_DATA) + "/atto_cpu_profile.json");
  return nlohmann::json::parse(in);
}

// The engine's layout of `params` at `stage` on `ranks` ranks with 2 MiB buckets; `int8`: in blocks of 256,
// INT8 reductions at stage 0 (each partition padded over the ranks), INT8 gathers at stages 1-3.
zero::ZeroLayout layout_of(const std::vector<nn::ParamInfo>& params, int stage, int ranks,
                           bool int8 = false) {
  zero::ZeroConfig c;
  c.stage = stage;
  c.bucket_bytes = 2 << 20;
  if (int8 && stage == 0) c.reduce_int8 = true;
  if (int8 && stage > 0) c.gather_dtype = DType::u8;
  return zero_layout(params, zero::make_step_plan(c, {.world = ranks}));
}

// req with the run of `cfg` (train::what_if_request makes it from the flags, as the app does).
WhatIfRequest with_run(WhatIfRequest req, const train::TrainConfig& cfg) {
  req.run = train::what_if_request(cfg).run;
  return req;
}

// An atto run on 64 px images of `micro_batch`, the what-if tests' usual model.
train::TrainConfig atto_run(int64_t micro_batch) {
  train::TrainConfig cfg;
  cfg.model = "atto";
  cfg.image_size = 64;
  cfg.micro_batch = micro_batch;
  return cfg;
}

// A request over `topo`, timed by the profiled compute table.
WhatIfRequest profiled_request(const dist::Topology& topo) {
  WhatIfRequest req;
  req.topology = topo;
  req.compute = compute_table_from_json(profile(), DType::f32);
  return req;
}

TEST(WhatIfComm, IsTheRingCostModelOnTheTestTopology) {
  const dist::Topology topo = test_box();
  const CommModel all(topo, 8);
  EXPECT_EQ(all.order(), topo.ring_order());
  for (Collective kind : {Collective::reduce_scatter, Collective::all_gather, Collective::all_reduce})
    for (double bytes : {8.0, 4096.0, 25.0 * (1 << 20), 64.0 * (1 << 20), 1e9})
      EXPECT_EQ(all.seconds(kind, bytes), topo.predict(topo.ring_order(), bytes, kind).time_s);
  // commbench --topo-file dual_socket_8gpu.json --show-ring: "predicted_busbw_GBps: 19.xx" (a 64 MiB
  // reduce-scatter); the what-if reports the same figure.
  WhatIfRequest req = profiled_request(topo);
  train::TrainConfig cfg = atto_run(8);
  req.stages = {0};
  const WhatIf w = what_if(with_run(req, cfg));
  ASSERT_EQ(w.rings.size(), 4u);  // 1, 2, 4, 8 ranks
  EXPECT_EQ(w.rings.back().reduce_scatter_busbw_gbps,
            topo.predict(topo.ring_order(), 64.0 * (1 << 20)).busbw_gbps);
  EXPECT_THAT(format_what_if(w), ::testing::HasSubstr(fmt::format(
                                     "64 MiB reduce-scatter {:.2f} GB/s bus",
                                     topo.predict(topo.ring_order(), 64.0 * (1 << 20)).busbw_gbps)));
  EXPECT_EQ(w.rings.back().order, topo.ring_order());
}

TEST(WhatIfComm, FewerRanksTakeTheFirstOfTheRing) {
  const dist::Topology topo = test_box();
  // Ring 0 2 4 6 1 3 5 7: two ranks share a switch, four a socket.
  const dist::Topology two = first_ranks(topo, 2), four = first_ranks(topo, 4);
  EXPECT_EQ(two.num_ranks(), 2);
  EXPECT_EQ(four.num_ranks(), 4);
  EXPECT_EQ(two.nodes()[size_t(two.node_of_rank(1))].id, "gpu1");
  EXPECT_EQ(four.nodes()[size_t(four.node_of_rank(3))].id, "gpu3");
  EXPECT_EQ(four.find("cpu1"), -1);
  // Within a socket the switch uplinks (24 GB/s) bound the ring, not the socket link (20 GB/s).
  EXPECT_GT(CommModel(topo, 4).predict(Collective::reduce_scatter, 1e8).busbw_gbps,
            CommModel(topo, 8).predict(Collective::reduce_scatter, 1e8).busbw_gbps);
  EXPECT_EQ(CommModel(topo, 1).seconds(Collective::all_reduce, 1e8), 0.0);
}

// Every collective the engine issues in a step, timed one by one with the ring cost model: what the what-if
// sums as comm_s (Note [ZeRO step]: buckets all-reduced at stage 0, reduce-scattered at 1-3; updated
// partitions all-gathered at 1-2; units gathered before forward and backward at 3; the mean loss and, at
// stages 1-3, the global norm all-reduced).
TEST(WhatIfStep, HoldsExactlyTheEnginesCollectives) {
  const dist::Topology topo = test_box();
  WhatIfRequest req = profiled_request(topo);
  train::TrainConfig cfg = atto_run(8);
  cfg.bucket_mb = 2;
  cfg.num_classes = 1000;  // the variant's own head, as convnext_variant("atto") has it
  const WhatIf w = what_if(with_run(req, cfg));
  const std::vector<nn::ParamInfo> params = nn::convnext_parameters(nn::convnext_variant("atto"));
  for (const WhatIfRow& row : w.rows) {
    SCOPED_TRACE(::testing::Message() << "stage " << row.stage << ", " << row.ranks << " ranks");
    const CommModel comm(topo, row.ranks);
    const zero::ZeroLayout L = layout_of(params, row.stage, row.ranks);
    double expected = 0;
    for (const zero::Partition& p : L.partitions) {
      const double bytes = double(p.numel) * 4;
      expected += comm.seconds(row.stage == 0 ? Collective::all_reduce : Collective::reduce_scatter, bytes);
      if (row.stage == 1 || row.stage == 2) expected += comm.seconds(Collective::all_gather, bytes);
      if (row.stage == 3) expected += 2 * comm.seconds(Collective::all_gather, bytes);
    }
    if (row.ranks > 1) expected += (row.stage > 0 ? 2 : 1) * comm.seconds(Collective::all_reduce, 8);
    EXPECT_NEAR(row.comm_s, expected, 1e-12 * expected + 1e-15);
    EXPECT_GE(row.step_s, row.compute_s);
    EXPECT_LE(row.comm_wait_s, row.comm_s + 1e-15);
    EXPECT_NEAR(row.step_s, row.compute_s + row.comm_wait_s + row.host_wait_s, 1e-12);
    EXPECT_GT(row.memory_bytes, 0);
  }
}

// --gather-dtype int8 (Note [Quantized gathers]): each parameter gather moves the N chunks' records of a
// layout aligned to 256 elements; --reduce-dtype int8 (Note [Quantized reduction]): each reduction N records,
// timed as a ring reduce-scatter of as many bytes (at stage 0 as a ring all-reduce).
TEST(WhatIfStep, QuantizedGathersAndReductionsMoveTheRecords) {
  const dist::Topology topo = test_box();
  const std::vector<nn::ParamInfo> params = nn::convnext_parameters(nn::convnext_variant("atto"));
  for (const char* reduce_dtype : {"fp32", "int8"}) {
    WhatIfRequest req;
    train::TrainConfig cfg = atto_run(8);
    cfg.bucket_mb = 2;
    cfg.num_classes = 1000;
    cfg.gather_dtype = "int8";
    cfg.reduce_dtype = reduce_dtype;
    cfg.stage = 3;  // the flags' check: int8 needs stages 1-3
    req.topology = topo;
    req.compute = compute_table_from_json(profile(), DType::f32);
    req.stages = {0, 1, 2, 3};  // stage 0 gathers nothing; with int8 reductions it all-reduces in records
    const WhatIf w = what_if(with_run(req, cfg));
    cfg.gather_dtype = "fp32";
    cfg.reduce_dtype = "fp32";
    const WhatIf f = what_if(with_run(req, cfg));
    const bool q = std::string(reduce_dtype) == "int8";
    ASSERT_EQ(w.rows.size(), f.rows.size());
    for (size_t i = 0; i < w.rows.size(); ++i) {
      const WhatIfRow& row = w.rows[i];
      SCOPED_TRACE(::testing::Message()
                   << "stage " << row.stage << ", " << row.ranks << " ranks, reduce " << reduce_dtype);
      if (row.stage == 0 && !q) {
        EXPECT_EQ(row.comm_bytes, f.rows[i].comm_bytes);
        continue;
      }
      if (row.ranks == 1) continue;
      const CommModel comm(topo, row.ranks);
      // Note [Quantized all-reduce]: two exchanges, timed as an all-reduce of N records.
      if (row.stage == 0) {
        const zero::ZeroLayout L = layout_of(params, 0, row.ranks, true);
        double expected = 0;
        for (size_t p = 0; p < L.partitions.size(); ++p)
          expected += comm.seconds(
              Collective::all_reduce,
              double(row.ranks) * double(dist::quant_packed_bytes(L.partitions[p].numel / row.ranks, 256)));
        expected += comm.seconds(Collective::all_reduce, 8);  // the loss (stage 0 has no sharded norm)
        EXPECT_NEAR(row.comm_s, expected, 1e-12 * expected + 1e-15);
        EXPECT_LT(double(row.comm_bytes) / double(f.rows[i].comm_bytes), 0.27);
        continue;
      }
      const zero::ZeroLayout L = layout_of(params, row.stage, row.ranks, true);
      double expected = 0;
      for (size_t p = 0; p < L.partitions.size(); ++p) {
        const double records = double(row.ranks) * double(dist::quant_packed_bytes(L.chunk(p), 256));
        expected += comm.seconds(Collective::reduce_scatter, q ? records : double(L.partitions[p].numel) * 4);
        expected += (row.stage == 3 ? 2 : 1) * comm.seconds(Collective::all_gather, records);
      }
      expected += 2 * comm.seconds(Collective::all_reduce, 8);
      EXPECT_NEAR(row.comm_s, expected, 1e-12 * expected + 1e-15);
      // Stage 3 (two gathers, one reduction): (2 x 0.254 + 1) / 3 of fp32's bytes with int8 gathers, 0.254
      // with both, and a little padding.
      const double ratio = double(row.comm_bytes) / double(f.rows[i].comm_bytes);
      EXPECT_LT(ratio, q ? 0.27 : row.stage == 3 ? 0.52 : 0.65);
    }
  }
}

TEST(WhatIfCompute, AProfileTimesItsOwnConfigurationAtTheMeasuredStepTime) {
  const nlohmann::json p = profile();
  const ComputeTable t = compute_table_from_json(p, DType::f32);
  EXPECT_TRUE(t.measured);
  EXPECT_THAT(t.provenance, ::testing::StartsWith("measured: bench_train_step --profile on cpu"));
  WhatIfRequest req;
  train::TrainConfig cfg;
  cfg.model = "atto";
  cfg.num_classes = 1000;  // bench_train_step's model
  cfg.image_size = p.at("image").get<int64_t>();
  cfg.micro_batch = p.at("batch").get<int64_t>();
  req.topology = first_ranks(test_box(), 1);
  req.compute = t;
  req.stages = {0};
  const WhatIf w = what_if(with_run(req, cfg));
  ASSERT_EQ(w.rows.size(), 1u);
  EXPECT_NEAR(w.rows[0].step_s, p.at("ms_per_step").get<double>() * 1e-3, 1e-9);
  // Twice the batch: every op's work doubles but the weights' do not, so a little under twice the time.
  cfg.micro_batch *= 2;
  const double doubled = what_if(with_run(req, cfg)).rows[0].step_s;
  EXPECT_GT(doubled, 1.8 * w.rows[0].step_s);
  EXPECT_LT(doubled, 2.0 * w.rows[0].step_s);
}

TEST(WhatIfCompute, ScaledAndRatesTablesSayWhatTheyAre) {
  nlohmann::json scaled = {
      {"profile", profile()},
      {"scale_from", {{"matmul_tflops", 1.0}, {"memory_gbps", 10.0}}},
      {"scale_to", {{"device", "GPU X"}, {"matmul_tflops", 100.0}, {"memory_gbps", 1000.0}}}};
  const ComputeTable s = compute_table_from_json(scaled, DType::f32);
  const ComputeTable m = compute_table_from_json(profile(), DType::f32);
  EXPECT_FALSE(s.measured);
  EXPECT_EQ(s.device, "GPU X");
  EXPECT_THAT(s.provenance, ::testing::StartsWith("scaled: bench_train_step --profile on cpu"));
  EXPECT_DOUBLE_EQ(s.per_op.at("linear").rate, 100 * m.per_op.at("linear").rate);
  EXPECT_DOUBLE_EQ(s.per_op.at("linear_gelu").rate, 100 * m.per_op.at("linear_gelu").rate);
  EXPECT_DOUBLE_EQ(s.per_op.at("layer_norm").rate, 100 * m.per_op.at("layer_norm").rate);
  const ComputeTable d = default_compute_table(DType::bf16);
  EXPECT_EQ(d.device, "RTX 4090");
  EXPECT_THAT(d.provenance, ::testing::StartsWith("planned: RTX 4090 rates, bf16"));
  EXPECT_DOUBLE_EQ(d.matmul_flops, 165.2e12 * 0.9);
  EXPECT_THROW(compute_table_from_json({{"memory_gbps", 1000}}, DType::bf16), ValueError);
  EXPECT_THROW(
      compute_table_from_json({{"matmul_tflops", {{"fp32", 80}}}, {"memory_gbps", 1000}}, DType::bf16),
      ValueError);
}

// The engine's overlap: at stage 0 the last bucket is all-reduced after backward, exposed, so coarse buckets
// (a quarter of the model, the most zero::bucket_elems allows) hide less than 25 MiB ones but pay fewer
// latencies; stage 3's prefetch hides gathers.
TEST(WhatIfStep, BackwardHidesEarlierBucketsAndPrefetchHidesGathers) {
  WhatIfRequest req;
  train::TrainConfig cfg = testing::cuda_bf16_run("tiny", 32);
  req.topology = test_box();
  req.compute = default_compute_table(DType::bf16);
  req.ranks = {8};
  auto row = [&](int stage) {
    req.stages = {stage};
    return what_if(with_run(req, cfg)).rows.at(0);
  };
  const WhatIfRow buckets = row(0);
  EXPECT_LT(buckets.comm_wait_s, 0.5 * buckets.comm_s);
  cfg.bucket_mb = 1024;
  const WhatIfRow coarse = row(0);
  EXPECT_GT(coarse.comm_wait_s, buckets.comm_wait_s);
  EXPECT_LE(coarse.comm_s, buckets.comm_s);  // the same bytes, fewer latencies
  EXPECT_GT(coarse.comm_s, 0.95 * buckets.comm_s);
  cfg.bucket_mb = 25;
  cfg.prefetch = 0;
  const WhatIfRow no_prefetch = row(3);
  cfg.prefetch = 2;
  const WhatIfRow prefetch = row(3);
  EXPECT_LT(prefetch.comm_wait_s, no_prefetch.comm_wait_s);
  EXPECT_NEAR(prefetch.comm_s, no_prefetch.comm_s, 1e-12);
}

// Two hosts of `per_host` CPU ranks joined by a `gbps` GB/s network link (the test bed's shape).
dist::Topology two_hosts(int per_host, double gbps) {
  nlohmann::json nodes = nlohmann::json::array();
  for (int h = 0; h < 2; ++h) {
    std::vector<int> ranks;
    for (int i = 0; i < per_host; ++i) ranks.push_back(h * per_host + i);
    nodes.push_back({{"id", fmt::format("host{}", h)}, {"type", "host"}, {"up_gbps", gbps}});
    nodes.push_back({{"id", fmt::format("cpu{}", h)},
                     {"type", "cpu"},
                     {"parent", fmt::format("host{}", h)},
                     {"up_gbps", 20}});
    nodes.push_back({{"id", fmt::format("proc{}", h)},
                     {"type", "proc"},
                     {"parent", fmt::format("cpu{}", h)},
                     {"up_gbps", 20},
                     {"ranks", ranks}});
  }
  return dist::Topology::from_json({{"nodes", nodes}});
}

// Note [What-if on a mesh]: one ring alone is the ring cost model; R rings across two hosts load each network
// link R times. Bytes a host sends across per step, for B bytes of model on 2 hosts x 2 ranks: flat stage 3
// makes three passes (gathers in forward and backward, the reduce-scatter), each 3B/4 over the host's one
// crossing hop of the 4-rank ring: 9B/4. HSDP all-reduces each rank's B/2 chunk across hosts: 2 x (B/4) per
// rank, B per host: 4/9 of flat. hpZ keeps backward's gathers inside the host: 2/3. At stage 0 the flat
// ring's all-reduce sends 2(n-1)/n B = 3B/2 per host, the two-level one 2(H-1)/H B = B: 2/3.
TEST(WhatIfMesh, RingsHostsAndCrossHostBytes) {
  const dist::Topology topo = two_hosts(2, 0.125);
  EXPECT_EQ(host_groups(topo), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  for (Collective kind : {Collective::reduce_scatter, Collective::all_reduce})
    EXPECT_EQ(topo.predict_rings({topo.ring_order()}, 1e7, kind).time_s,
              topo.predict(topo.ring_order(), 1e7, kind).time_s);
  const dist::RingPrediction one = topo.predict_rings({{0, 2}}, 1e7, Collective::all_reduce);
  const dist::RingPrediction both = topo.predict_rings({{0, 2}, {1, 3}}, 1e7, Collective::all_reduce);
  EXPECT_EQ(one.max_link_load, 1);
  EXPECT_EQ(both.max_link_load, 2);
  EXPECT_NEAR(both.time_s, 2 * one.time_s, 1e-5);

  WhatIfRequest req = profiled_request(topo);
  train::TrainConfig cfg = atto_run(16);
  req.ranks = {4};
  req.stages = {3};
  auto row = [&](const std::string& shard_group, bool hpz, const std::string& impl = "flat") {
    cfg.shard_group = shard_group;
    cfg.hpz = hpz;
    cfg.comm_impl = impl;
    return what_if(with_run(req, cfg)).rows.at(0);
  };
  cfg.stage = 3;  // --hpz is for stage 3
  const WhatIfRow flat = row("world", false), hsdp = row("host", false), hpz = row("world", true);
  EXPECT_GT(flat.cross_host_bytes, 0);
  EXPECT_NEAR(double(hsdp.cross_host_bytes) / double(flat.cross_host_bytes), 4.0 / 9.0, 0.01);
  EXPECT_NEAR(double(hpz.cross_host_bytes) / double(flat.cross_host_bytes), 2.0 / 3.0, 0.01);
  EXPECT_LT(hsdp.step_s, flat.step_s);
  EXPECT_LT(hpz.step_s, flat.step_s);
  req.stages = {0};
  cfg.stage = 0;
  const WhatIfRow flat0 = row("world", false), hier0 = row("world", false, "hier");
  EXPECT_NEAR(double(hier0.cross_host_bytes) / double(flat0.cross_host_bytes), 2.0 / 3.0, 0.01);
  // auto takes whichever the communicator's model predicts faster, call by call: never slower than both.
  const WhatIfRow auto0 = row("world", false, "auto");
  EXPECT_LE(auto0.comm_s, std::max(flat0.comm_s, hier0.comm_s) + 1e-12);
}

// Note [CPU ranks pay for their messages]: with comm_cpu, a collective lasts at least its slowest rank's core
// time on the bytes it sends, receives and adds, and the compute stream owes that time too; rates too high to
// matter give the step without them, and a table with half the rates is not faster. On the flat 4-rank ring
// over 2 hosts every rank has one network hop and one shared-memory hop, so a stage-0 all-reduce of b bytes
// (each rank sends and receives 3b/2, adds 3b/4) costs 3b/4 / net + 3b/4 / shm + 3b/4 / red; a ring step's
// fixed time (step_us) lengthens the collective.
TEST(WhatIfMesh, CpuRanksPayForTheirMessages) {
  WhatIfRequest req;
  train::TrainConfig cfg = atto_run(16);
  cfg.bucket_mb = 2;
  cfg.comm_impl = "flat";
  req.topology = two_hosts(2, 1000.0);  // links too fast to matter: the cores decide
  req.ranks = {4};
  req.stages = {0};
  nlohmann::json table = profile();
  req.compute = compute_table_from_json(table, DType::f32);
  const WhatIfRow free = what_if(with_run(req, cfg)).rows.at(0);
  EXPECT_EQ(free.comm_cpu_s, 0);

  table["comm_cpu"] = {{"network_gbps", 1e6}, {"shared_memory_gbps", 1e6}, {"reduce_gbps", 1e6}};
  req.compute = compute_table_from_json(table, DType::f32);
  EXPECT_NEAR(what_if(with_run(req, cfg)).rows.at(0).step_s, free.step_s, 1e-6 * free.step_s);

  const double net = 0.5e9, shm = 2e9, red = 4e9;
  table["comm_cpu"] = {
      {"network_gbps", net / 1e9}, {"shared_memory_gbps", shm / 1e9}, {"reduce_gbps", red / 1e9}};
  req.compute = compute_table_from_json(table, DType::f32);
  EXPECT_THAT(req.compute.provenance, ::testing::HasSubstr("0.50 GB/s network, 2.00 GB/s shared memory"));
  const WhatIfRow paid = what_if(with_run(req, cfg)).rows.at(0);
  const zero::ZeroLayout L = layout_of(nn::convnext_parameters(cfg.model_config()), 0, 4);
  const CommModel ring(req.topology, 4);
  double cpu = 0, comm = 0;
  auto all_reduce = [&](double b) {
    const double c = 0.75 * b / net + 0.75 * b / shm + 0.75 * b / red;
    cpu += c;
    comm += std::max(c, ring.seconds(Collective::all_reduce, b));
  };
  all_reduce(8);  // the mean loss: the ring's latency, more than its core time
  for (const zero::Partition& p : L.partitions) all_reduce(double(p.numel) * 4);
  EXPECT_NEAR(paid.comm_s, comm, 1e-9 * comm);
  EXPECT_GT(paid.comm_cpu_s, 0);
  EXPECT_GE(paid.step_s, free.compute_s + cpu - 1e-12);
  EXPECT_NEAR(paid.step_s, paid.compute_s + paid.comm_cpu_s + paid.comm_wait_s, 1e-12);
  EXPECT_NEAR(paid.compute_s, free.compute_s, 1e-12);

  // A ring step's fixed time lengthens every collective by its steps (6 for an all-reduce on 4 ranks).
  table["comm_cpu"]["step_us"] = 100;
  req.compute = compute_table_from_json(table, DType::f32);
  const double collectives = double(L.partitions.size()) + 1;
  EXPECT_NEAR(what_if(with_run(req, cfg)).rows.at(0).comm_s, comm + collectives * 6 * 100e-6, 1e-9 * comm);

  table["comm_cpu"] = {{"network_gbps", 0.25}, {"shared_memory_gbps", 1}, {"reduce_gbps", 2}};
  req.compute = compute_table_from_json(table, DType::f32);
  EXPECT_GT(what_if(with_run(req, cfg)).rows.at(0).step_s, paid.step_s);

  table["comm_cpu"] = {{"network_gbps", 0.5}, {"shared_memory_gbps", 2}};
  EXPECT_THROW(compute_table_from_json(table, DType::f32), ValueError);
  table["comm_cpu"] = {{"network_gbps", 0.5}, {"shared_memory_gbps", 2}, {"reduce_gbps", 4}, {"tcp_gbps", 1}};
  EXPECT_THROW(compute_table_from_json(table, DType::f32), ValueError);
}

}  // namespace
}  // namespace cz::plan
