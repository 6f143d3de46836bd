// Quantized parameter gathers (--gather-dtype, Note [Quantized gathers]) across ranks (mpirun -np 2 and 4):
// the weights every forward computes with are the block round trip of the fp32 master, checked against the
// quantizer applied here to each tensor; the master and the checkpoints stay fp32 and move between runs
// with and without quantization; the bytes the engine counts are the records'.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/comm/mesh.h"
#include "dist/comm/quant.h"
#include "dist/train/trainer.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/quant_reduce.h"
#include "dist/zero/quant_reduce_hier.h"
#include "tensor/half.h"
#include "tensor/ops.h"
#include "zero_testing.h"

#include "zero_quant_testing.h"
namespace cz::train {
namespace {

using namespace quant_testing;

TEST(QuantGather, EveryForwardComputesWithTheRoundTripOfTheMaster) {
  for (int stage = 1; stage <= 3; ++stage)
    for (bool ckpt : {false, true}) {
      if (stage < 3 && ckpt) continue;
      TrainConfig c = quant_config(stage, "int8");
      c.activation_checkpointing = ckpt;  // stage 3: the recompute gathers again inside backward
      c.prefetch = 2;
      c.ema_decay = 0.99;
      Trainer t(c, world());
      EXPECT_EQ(t.engine().layout().flat.align, kBlock);
      ComputeCopyCheck check(t);
      for (int i = 0; i < 3; ++i) {
        check.expect_from_master();
        // The master is not the round trip: quantization never wrote it (most values are off the grid).
        EXPECT_GT(check.moved_, t.model().num_parameters() / 2) << "stage " << stage;
        t.step();
      }
      // Evaluation (no-grad forwards; stage 3 gathers unit by unit), with the EMA swapped in and out.
      check.expect_from_master();
      t.evaluate();
      t.engine().swap_ema();
      check.expect_from_master();
      t.evaluate();
      t.engine().swap_ema();
      EXPECT_GT(check.checked_, 0);
      EXPECT_EQ(check.wrong_, 0) << "stage " << stage << (ckpt ? " with activation checkpointing" : "");
      if (world().rank() == 0)
        std::printf("stage %d%s, %d ranks: %lld parameter reads, %lld not the round trip of the master\n",
                    stage, ckpt ? " (checkpointing)" : "", world().size(), (long long)check.checked_,
                    (long long)check.wrong_);
    }
  // bf16 gathers at fp32 compute (the CPU): the master rounded to bf16.
  for (int stage : {2, 3}) {
    Trainer t(quant_config(stage, "bf16"), world());
    ComputeCopyCheck check(t, true);
    for (int i = 0; i < 2; ++i) {
      check.expect_from_master();
      t.step();
    }
    EXPECT_GT(check.checked_, 0);
    EXPECT_EQ(check.wrong_, 0) << "bf16 gathers at stage " << stage;
  }
  // The check is not vacuous: unquantized gathers compute with the master itself.
  Trainer t(quant_config(3, "fp32"), world());
  ComputeCopyCheck check(t);
  check.expect_from_master();
  t.step();
  EXPECT_GT(check.wrong_, 0);
}

// The same run at every stage: the weights gathered are a function of the master alone (blocks start at
// each tensor, whatever the chunks), so stages 1-3 agree as unquantized stages do (to the order of sums).
TEST(QuantGather, StagesAgreeAndStayNearFp32) {
  std::vector<std::vector<double>> losses;
  for (int stage = 1; stage <= 3; ++stage) {
    Trainer t(quant_config(stage, "int8"), world());
    losses.emplace_back();
    for (int i = 0; i < 4; ++i) losses.back().push_back(t.step().loss);
  }
  Trainer f(quant_config(3, "fp32"), world());
  std::vector<double> fp32;
  for (int i = 0; i < 4; ++i) fp32.push_back(f.step().loss);
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-6 * std::abs(losses[0][i])) << "step " << i + 1;
    EXPECT_NEAR(losses[2][i], losses[0][i], 1e-6 * std::abs(losses[0][i])) << "step " << i + 1;
    // Quantized, not equal to fp32, but close: 0.5% of a block's peak per weight.
    EXPECT_NE(losses[2][i], fp32[i]);
    EXPECT_NEAR(losses[2][i], fp32[i], 1e-2 * std::abs(fp32[i])) << "step " << i + 1;
  }
}

// comm_bytes: the reduce-scatters in fp32 as before; each gather of a partition sends (N - 1) records of
// quant_packed_bytes(chunk) (codes and scales) from each rank: stage 3 twice (forward, backward), stages 1-2
// once (after the update).
TEST(QuantGather, CommMeterCountsTheRecords) {
  const int n = world().size();
  for (int stage = 1; stage <= 3; ++stage) {
    TrainConfig c = quant_config(stage, "int8");
    c.grad_accum = 1;
    c.steps = 1;
    Trainer t(c, world());
    const StepStats s = t.step();
    const zero::ZeroLayout& L = t.engine().layout();
    int64_t expected = 0;
    for (size_t p = 0; p < L.partitions.size(); ++p) {
      expected += L.partitions[p].numel * 4 * (n - 1) / n;  // reduce-scatter
      expected += (stage == 3 ? 2 : 1) * (n - 1) * dist::quant_packed_bytes(L.chunk(p), kBlock);
    }
    EXPECT_EQ(s.comm_bytes, expected) << "stage " << stage;
    TrainConfig f = c;
    f.gather_dtype = "fp32";
    Trainer tf(f, world());
    const StepStats sf = tf.step();
    if (world().rank() == 0)
      std::printf(
          "stage %d, %d ranks: comm_bytes %lld with int8 gathers, %lld fp32 (%.3f; padded flat %lld "
          "against %lld elements)\n",
          stage, n, (long long)s.comm_bytes, (long long)sf.comm_bytes,
          double(s.comm_bytes) / double(sf.comm_bytes), (long long)L.flat.numel,
          (long long)tf.engine().layout().flat.numel);
    EXPECT_LT(s.comm_bytes, sf.comm_bytes) << "stage " << stage;
  }
}

// Checkpoints hold the fp32 master (never the round trip) in per-tensor ranges: a quantized run resumes
// itself bit for bit, and its checkpoint loads into an unquantized run (another layout: 16-element
// alignment) with exactly the master it saved, and back.
TEST(QuantGather, CheckpointsHoldTheFp32MasterAndResume) {
  const std::string dir = fmt::format("/tmp/cz_quant_resume_{}", ::getppid());  // the same on every rank
  for (int variant = 0; variant < 3; ++variant) {
    const int stage = variant == 0 ? 1 : 3;
    TrainConfig c = quant_config(stage, "int8");
    if (variant == 2) c.reduce_dtype = "int8";  // the reductions leave no state: resumed the same
    c.steps = 8;
    c.ema_decay = 0.99;
    c.data = "synthetic:n=96,eval_n=16,classes=5";
    std::vector<double> straight;
    std::map<std::string, std::vector<float>> w_straight;
    {
      Trainer t(c, world());
      for (int i = 0; i < 8; ++i) straight.push_back(t.step().loss);
      w_straight = masters(t);
    }
    c.checkpoint_dir = dir + "/v" + std::to_string(variant);
    std::map<std::string, std::vector<float>> w_saved;
    {
      Trainer t(c, world());
      for (int i = 0; i < 4; ++i) EXPECT_EQ(t.step().loss, straight[size_t(i)]);
      t.save_checkpoint();
      t.finish_pending_save();
      w_saved = masters(t);
    }
    c.resume = c.checkpoint_dir;
    {
      Trainer t(c, world());
      for (int i = 4; i < 8; ++i)
        EXPECT_EQ(t.step().loss, straight[size_t(i)]) << "stage " << stage << " step " << i + 1;
      EXPECT_EQ(masters(t), w_straight) << "stage " << stage;
    }
    TrainConfig f = c;
    f.gather_dtype = "fp32";
    f.reduce_dtype = "fp32";
    f.stage = 3;
    Trainer t(f, world());
    EXPECT_NE(t.engine().layout().flat.numel, 0);
    EXPECT_EQ(masters(t), w_saved) << "stage " << stage << " int8 -> stage 3 fp32";
  }
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// Note [Quantized reduction], on a bucket of known values: every rank can make every rank's input, so each
// checks its reduced chunk bit for bit against the owner's fp32 sum of the others' round trips, in group
// order; the bytes are (N - 1) records; a NaN in one rank's input reaches its owner as that block's NaNs
// only.
// (The inputs: quant_testing::inputs_of.)

// The ring communicator the engine's quantized reductions run on, over the world.
std::unique_ptr<dist::Communicator> ring_communicator() {
  dist::CommOptions opt;
  opt.algorithm = dist::Algorithm::ring;
  return dist::make_communicator(world(), opt);
}

TEST(QuantReduce, EachChunkIsTheOwnersFp32SumOfTheOthersRecords) {
  const int n = world().size(), me = world().rank();
  const auto comm = ring_communicator();
  const dist::ProcessGroup g(comm.get(), Device::cpu());
  const int64_t chunk = 3 * kBlock + 100;  // a short last block
  auto bucket_of = [&](int r, bool nan) {
    std::vector<float> v = inputs_of(r, n * chunk);
    if (nan && r == 1) v[size_t(kBlock + 5)] = NAN;  // chunk 0, block 1: rank 0's
    return v;
  };
  for (bool nan : {false, true}) {
    zero::CommMeter meter;
    meter.begin_step();
    const std::vector<float> mine_in = bucket_of(me, nan);
    Tensor bucket = from_vector(mine_in, {n * chunk});
    {
      zero::QuantizedReduceScatter q(g, bucket, chunk, kBlock, meter);
      q.finish(1.0 / n);
    }
    StepStats s;
    meter.finish_step(s);
    EXPECT_EQ(s.comm_bytes, (n - 1) * dist::quant_packed_bytes(chunk, kBlock));
    // The reference: own values, plus each other rank's record of our chunk, in group order, then 1/N.
    Tensor expected = from_vector(
        std::vector<float>(mine_in.begin() + me * chunk, mine_in.begin() + (me + 1) * chunk), {chunk});
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const std::vector<float> x = bucket_of(r, nan);
      std::vector<int8_t> codes(static_cast<size_t>(chunk));
      std::vector<float> scales(size_t(dist::quant_scale_count(chunk, kBlock)));
      dist::quantize(DType::f32, x.data() + me * chunk, chunk, kBlock, codes.data(), scales.data());
      dist::dequantize_add_quantize(codes.data(), scales.data(), expected.data<float>(), chunk, kBlock,
                                    nullptr, nullptr, expected.data<float>());
    }
    expected.mul_(1.0 / n);
    const std::vector<float> got = bucket.narrow(0, me * chunk, chunk).contiguous().to_vector<float>();
    const std::vector<float> want = expected.to_vector<float>();
    int64_t differ = 0, non_finite = 0;
    double worst = 0;
    for (int64_t i = 0; i < chunk; ++i) {
      if (std::memcmp(&got[size_t(i)], &want[size_t(i)], sizeof(float)) != 0) ++differ;
      if (!std::isfinite(got[size_t(i)])) {
        ++non_finite;
        continue;
      }
      // Against the exact mean: each other rank's value is off by at most half its block's scale.
      double exact = 0, bound = 0;
      for (int r = 0; r < n; ++r) {
        const std::vector<float> x = bucket_of(r, false);
        exact += x[size_t(me * chunk + i)];
        if (r == me) continue;
        float peak = 0;
        const int64_t b0 = i / kBlock * kBlock;
        for (int64_t k = b0; k < std::min(chunk, b0 + kBlock); ++k)
          peak = std::max(peak, std::abs(x[size_t(me * chunk + k)]));
        bound += peak / 127 * (0.5 + 1e-4);
      }
      worst = std::max(worst, std::abs(got[size_t(i)] - exact / n) / (bound / n + 1e-30));
    }
    EXPECT_EQ(differ, 0) << (nan ? "with a NaN" : "");
    EXPECT_LE(worst, 1.0 + 1e-3);  // in units of the summed per-sender bounds (plus f32 rounding)
    // A NaN in rank 1's chunk 0 poisons exactly rank 0's block 1, nothing else.
    EXPECT_EQ(non_finite, nan && me == 0 && n > 1 ? kBlock : 0);
  }
}

// Note [Quantized all-reduce]: every rank ends with the same bucket, bit for bit: each chunk's owner's fp32
// sum of its own values and the others' records, averaged, then one more round trip through a record; within
// the senders' bounds plus half a scale of the average of the exact mean; 2 (N - 1) records sent.
TEST(QuantReduce, AllReduceGivesEveryRankTheSameRoundTripOfTheOwnersMean) {
  const int n = world().size(), me = world().rank();
  const auto comm = ring_communicator();
  const dist::ProcessGroup g(comm.get(), Device::cpu());
  const int64_t chunk = 3 * kBlock;  // whole blocks: the stage-0 layout pads buckets to N x B
  auto bucket_of = [&](int r) { return inputs_of(r, n * chunk); };
  zero::CommMeter meter;
  meter.begin_step();
  Tensor bucket = from_vector(bucket_of(me), {n * chunk});
  {
    zero::QuantizedAllReduce q(g, bucket, kBlock, meter);
    q.finish(1.0 / n);
  }
  StepStats s;
  meter.finish_step(s);
  const int64_t rec = dist::quant_packed_bytes(chunk, kBlock);
  EXPECT_EQ(s.comm_bytes, 2 * (n - 1) * rec);
  const std::vector<float> got = bucket.to_vector<float>();
  std::vector<int8_t> codes(static_cast<size_t>(chunk));
  std::vector<float> scales(size_t(dist::quant_scale_count(chunk, kBlock)));
  int64_t differ = 0;
  double worst = 0;
  for (int c = 0; c < n; ++c) {  // chunk c, as its owner (rank c) sums it
    const std::vector<float> own = bucket_of(c);
    std::vector<float> sum(own.begin() + c * chunk, own.begin() + (c + 1) * chunk);
    for (int r = 0; r < n; ++r) {
      if (r == c) continue;
      const std::vector<float> x = bucket_of(r);
      dist::quantize(DType::f32, x.data() + c * chunk, chunk, kBlock, codes.data(), scales.data());
      dist::dequantize_add_quantize(codes.data(), scales.data(), sum.data(), chunk, kBlock, nullptr, nullptr,
                                    sum.data());
    }
    Tensor mean = from_vector(sum, {chunk});
    mean.mul_(1.0 / n);
    std::vector<float> want(static_cast<size_t>(chunk));
    dist::quantize(DType::f32, mean.data<float>(), chunk, kBlock, codes.data(), scales.data());
    dist::dequantize(codes.data(), scales.data(), chunk, kBlock, DType::f32, want.data());
    const std::vector<float> m = mean.to_vector<float>();
    for (int64_t i = 0; i < chunk; ++i) {
      const float v = got[size_t(c * chunk + i)];
      if (std::memcmp(&v, &want[size_t(i)], sizeof(float)) != 0) ++differ;
      double exact = 0, bound = 0;
      const int64_t b0 = i / kBlock * kBlock;
      for (int r = 0; r < n; ++r) {
        const std::vector<float> x = bucket_of(r);
        exact += x[size_t(c * chunk + i)];
        if (r == c) continue;
        float peak = 0;
        for (int64_t k = b0; k < b0 + kBlock; ++k) peak = std::max(peak, std::abs(x[size_t(c * chunk + k)]));
        bound += peak / 127 * (0.5 + 1e-4);
      }
      float mean_peak = 0;
      for (int64_t k = b0; k < b0 + kBlock; ++k) mean_peak = std::max(mean_peak, std::abs(m[size_t(k)]));
      worst = std::max(worst, std::abs(v - exact / n) / (bound / n + mean_peak / 127 * (0.5 + 1e-4) + 1e-30));
    }
  }
  EXPECT_EQ(differ, 0);
  EXPECT_LE(worst, 1.0 + 1e-3);
}

// Through the trainer: stages 1-3 with int8 reductions (and both) learn near fp32; the bytes are the
// records'.
TEST(QuantReduce, TrainsNearFp32AndCountsTheRecords) {
  const int n = world().size();
  for (int stage = 1; stage <= 3; ++stage)
    for (const char* gather : {"fp32", "int8"}) {
      TrainConfig c = quant_config(stage, gather);
      c.reduce_dtype = "int8";
      c.grad_accum = 1;
      TrainConfig f = quant_config(stage, "fp32");
      f.grad_accum = 1;
      Trainer t(c, world()), tf(f, world());
      for (int i = 0; i < 4; ++i) {
        const StepStats s = t.step(), sf = tf.step();
        EXPECT_NEAR(s.loss, sf.loss, 2e-2 * sf.loss) << "stage " << stage << " step " << i + 1;
        if (i > 0) {
          EXPECT_NE(s.loss, sf.loss);
          continue;
        }
        const zero::ZeroLayout& L = t.engine().layout();
        int64_t expected = 0;
        for (size_t p = 0; p < L.partitions.size(); ++p) {
          const int64_t rec = dist::quant_packed_bytes(L.chunk(p), kBlock);
          expected += (n - 1) * rec;  // the reduction's records
          const int64_t gathers = stage == 3 ? 2 : 1;
          expected += gathers * (std::string(gather) == "int8" ? (n - 1) * rec
                                                               : L.partitions[p].numel * 4 * (n - 1) / n);
        }
        EXPECT_EQ(s.comm_bytes, expected) << "stage " << stage << " gathers " << gather;
        if (world().rank() == 0)
          std::printf(
              "stage %d, %d ranks, int8 reductions, %s gathers: comm_bytes %lld, %.3f of fp32's %lld\n",
              stage, n, gather, (long long)s.comm_bytes, double(s.comm_bytes) / double(sf.comm_bytes),
              (long long)sf.comm_bytes);
      }
    }
}

// Under offload the records are encoded from the compute chunks (the master is on the host), written from
// the master just before: on the CPU backend offload changes no bit, quantized or not.
TEST(QuantGather, OffloadChangesNoBit) {
  for (int stage : {2, 3}) {
    std::vector<double> losses[2];
    for (int off = 0; off < 2; ++off) {
      TrainConfig c = quant_config(stage, "int8");
      c.reduce_dtype = "int8";
      c.ema_decay = 0.9;
      c.offload_optimizer = off == 1;
      Trainer t(c, world());
      for (int i = 0; i < 3; ++i) losses[off].push_back(t.step().loss);
    }
    EXPECT_EQ(losses[0], losses[1]) << "stage " << stage;
  }
}

TEST(QuantGather, BadCombinationsStopWithAMessage) {
  TrainConfig c = quant_config(0, "int8");
  try {
    c.validate();
    ADD_FAILURE() << "stage 0 with int8 gathers was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("--gather-dtype int8 is for --stage 1-3"), std::string::npos)
        << e.what();
  }
  c = quant_config(3, "int4");
  EXPECT_THROW(c.validate(), ValueError);
  c = quant_config(3, "int8");
  c.reduce_dtype = "int8";
  c.validate();
  c.shard_group = "host";
  EXPECT_THROW(c.validate(), ValueError);  // the cross all-reduce is not quantized
  c.shard_group = "world";
  c.stage = 0;
  c.gather_dtype = "fp32";
  c.validate();  // stage 0 all-reduces in two quantized exchanges (Note [Quantized all-reduce])
  c.shard_group = "host";
  EXPECT_THROW(c.validate(), ValueError);
}

// Stage 0 with int8 reductions: the replicas stay identical (every rank's weights equal rank 0's, bit for
// bit), the losses stay near fp32's, and each bucket costs 2 (N - 1) records.
TEST(QuantReduce, StageZeroKeepsTheReplicasIdenticalNearFp32) {
  const int n = world().size();
  TrainConfig c = quant_config(0, "fp32");
  c.reduce_dtype = "int8";
  c.grad_accum = 1;
  TrainConfig f = quant_config(0, "fp32");
  f.grad_accum = 1;
  Trainer t(c, world()), tf(f, world());
  for (int i = 0; i < 4; ++i) {
    const StepStats s = t.step(), sf = tf.step();
    EXPECT_NEAR(s.loss, sf.loss, 2e-2 * sf.loss) << "step " << i + 1;
    if (i == 0) {
      const zero::ZeroLayout& L = t.engine().layout();
      int64_t expected = 0;
      for (size_t p = 0; p < L.partitions.size(); ++p) {
        EXPECT_EQ(L.partitions[p].numel % (n * kBlock), 0) << "bucket " << p;
        expected += 2 * (n - 1) * dist::quant_packed_bytes(L.partitions[p].numel / n, kBlock);
      }
      EXPECT_EQ(s.comm_bytes, n > 1 ? expected : 0);
      if (world().rank() == 0)
        std::printf("stage 0, %d ranks, int8 reductions: comm_bytes %lld, %.3f of fp32's %lld\n", n,
                    (long long)s.comm_bytes, double(s.comm_bytes) / double(sf.comm_bytes),
                    (long long)sf.comm_bytes);
    }
  }
  // Every rank's parameters equal rank 0's.
  for (const auto& [name, p] : t.model().named_parameters()) {
    Tensor mine = p.contiguous().to(DType::f32), root = mine.clone();
    MPI_Bcast(root.raw_data(), int(root.nbytes()), MPI_BYTE, 0, world().comm());
    EXPECT_TRUE(std::memcmp(mine.raw_data(), root.raw_data(), size_t(mine.nbytes())) == 0) << name;
  }
}

}  // namespace
}  // namespace cz::train
