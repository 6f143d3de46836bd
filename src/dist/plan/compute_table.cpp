// Op rates for the what-if model (compute_table.h): from a measured profile, a scaled one, or peak rates.
#include "dist/plan/compute_table.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "dist/plan/zero_memory.h"
#include "nn/convnext.h"
#include "tensor/check.h"
#include "tensor/device.h"

namespace cz::plan {
namespace {

// Note [RTX 4090 rates]: the spec sheet (Ada whitepaper: 165.2 dense bf16/fp16 tensor TFLOP/s with fp32
// accumulation, 82.6 fp32; 1008 GB/s GDDR6X) times efficiencies fitted to timm's posted RTX 3090 training
// throughput (results/benchmark-train-amp-nhwc-pt112-cu113-rtx3090.csv, AMP, channels-last: ConvNeXt-T 819,
// S 487, B 339, L 188, XL 116 img/s at batches 256/192/128/96/64) with the 3090's own spec sheet (71 TFLOP/s,
// 936 GB/s) through this same op list: docs/planning.md has the fit and its residuals. Not a measurement of
// this code on a 4090: a planned figure.
constexpr const char* kRtx4090 = R"json({
  "device": "RTX 4090",
  "source": "spec sheet x efficiencies fitted to timm's RTX 3090 ConvNeXt training throughput (Note [RTX 4090 rates])",
  "matmul_tflops": {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
  "memory_gbps": 1008,
  "efficiency": {"matmul": 0.9, "memory": 0.4, "depthwise": 0.1},
  "op_overhead_us": 5,
  "host_optimizer_gbps": 10
})json";

const char* dtype_key(DType d) {
  return d == DType::bf16 ? "bf16" : d == DType::f16 ? "fp16" : "fp32";
}

double number(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key)) return fallback;
  CZ_CHECK(j.at(key).is_number(), "compute table: '{}' must be a number, got {}", key, j.at(key).dump());
  return j.at(key).get<double>();
}

// matmul_tflops: one number, or one per dtype.
double matmul_tflops(const nlohmann::json& j, DType compute) {
  CZ_CHECK(j.contains("matmul_tflops"), "compute table: no 'matmul_tflops'");
  const nlohmann::json& m = j.at("matmul_tflops");
  if (m.is_number()) return m.get<double>();
  CZ_CHECK(m.is_object() && m.contains(dtype_key(compute)),
           "compute table: 'matmul_tflops' has no rate for {} (give a number or an object with \"{}\")",
           dtype_key(compute), dtype_key(compute));
  return m.at(dtype_key(compute)).get<double>();
}

ComputeTable from_rates(const nlohmann::json& j, DType compute) {
  ComputeTable t;
  t.device = j.value("device", std::string("(unnamed device)"));
  const nlohmann::json eff = j.value("efficiency", nlohmann::json::object());
  const double flops = matmul_tflops(j, compute) * 1e12, bw = number(j, "memory_gbps", 0) * 1e9;
  CZ_CHECK(flops > 0 && bw > 0, "compute table: matmul_tflops and memory_gbps must be positive");
  t.matmul_flops = flops * number(eff, "matmul", 1);
  t.memory_bytes = bw * number(eff, "memory", 1);
  t.depthwise_bytes = bw * number(eff, "depthwise", number(eff, "memory", 1));
  t.op_overhead_s = number(j, "op_overhead_us", 0) * 1e-6;
  t.host_bytes = number(j, "host_optimizer_gbps", 10) * 1e9;
  t.provenance = fmt::format("planned: {} rates, {} ({})", t.device, dtype_key(compute),
                             j.value("source", std::string("peak rates x efficiencies")));
  return t;
}

// A bench_train_step --profile --json result: each op's rate over the work op_costs.h counts for it.
ComputeTable from_profile(const nlohmann::json& p) {
  for (const char* key : {"model", "batch", "image", "dtype", "ops", "ms_per_step"})
    CZ_CHECK(p.contains(key), "compute table: the profile has no '{}' (expected bench_train_step --json)",
             key);
  const std::string dt = p.at("dtype").get<std::string>();
  const DType dtype = dt == "bf16" ? DType::bf16 : dt == "f16" ? DType::f16 : DType::f32;
  const nn::ConvNeXtConfig cfg = nn::convnext_variant(p.at("model").get<std::string>());
  const int64_t batch = p.at("batch").get<int64_t>(), image = p.at("image").get<int64_t>();
  std::map<std::string, OpCost> work;  // summed per op name
  auto count = [&](const OpCost& op) {
    OpCost& w = work.try_emplace(op.name, OpCost{op.name, op.cls, 0, 0, {}}).first->second;
    w.flops += op.flops;
    w.bytes += op.bytes;
  };
  const bool cuda = parse_device(p.value("device", std::string("cpu"))).is_cuda();
  for (const ModuleCost& m : step_work(*nn::convnext_spec(cfg), image, batch, dtype, false, cuda)) {
    for (const OpCost& op : m.forward) count(op);
    for (const OpCost& op : m.backward) count(op);
  }
  const int64_t params = flat_numel(nn::convnext_parameters(cfg));
  count(optimizer_work(params, dtype != DType::f32));
  // The gradient buffer's fill runs on CUDA only (Note [Deferred gradient zero]): a CPU profile's "fill" (an
  // older build's, or the loss's one-element seed) is time outside the ops counted.
  if (cuda) count(zero_grad_work(params * int64_t(dtype_size(dtype))));
  // Time outside the ops we count (and the profiler's own cost) is spread over them in proportion, so that
  // the profiled configuration is timed at its measured ms_per_step.
  double known_ms = 0;
  for (const auto& op : p.at("ops"))
    if (work.count(op.at("name").get<std::string>())) known_ms += op.at("ms_per_step").get<double>();
  CZ_CHECK(known_ms > 0,
           "compute table: the profile has no op this model knows (was it run with --profile?)");
  const double scale = p.at("ms_per_step").get<double>() / known_ms;
  ComputeTable t;
  t.device = p.value("device", std::string("?"));
  t.measured = true;
  double sum_t[3] = {}, sum_w[3] = {};
  for (const auto& op : p.at("ops")) {
    const auto it = work.find(op.at("name").get<std::string>());
    if (it == work.end()) continue;
    const double s = op.at("ms_per_step").get<double>() * scale * 1e-3;
    const OpCost& w = it->second;
    const bool by_flops = w.cls == OpClass::matmul;
    const double amount = by_flops ? w.flops : w.bytes;
    if (s <= 0 || amount <= 0) continue;
    t.per_op[it->first] = {by_flops, amount / s};
    sum_t[int(w.cls)] += s;
    sum_w[int(w.cls)] += amount;
  }
  auto rate = [&](OpClass c, double fallback) {
    return sum_t[int(c)] > 0 ? sum_w[int(c)] / sum_t[int(c)] : fallback;
  };
  t.memory_bytes = rate(OpClass::memory, 1e9);
  t.matmul_flops = rate(OpClass::matmul, 1e9);
  t.depthwise_bytes = rate(OpClass::depthwise, t.memory_bytes);
  t.host_bytes = 10e9;
  t.provenance = fmt::format(
      "measured: bench_train_step --profile on {} ({}, batch {}, {} px, {}: {:.2f} ms/step), op by op",
      t.device, cfg.name, batch, image, dt, p.at("ms_per_step").get<double>());
  return t;
}

// {"profile": P, "scale_from": RATES, "scale_to": RATES}: P's rates times the ratio of peak rates.
ComputeTable scaled(const nlohmann::json& j, DType compute) {
  ComputeTable t = from_profile(j.at("profile"));
  const nlohmann::json &from = j.at("scale_from"), &to = j.at("scale_to");
  const double f = matmul_tflops(to, compute) / matmul_tflops(from, compute);
  const double b = number(to, "memory_gbps", 0) / number(from, "memory_gbps", 0);
  CZ_CHECK(f > 0 && b > 0,
           "compute table: scale_from and scale_to need positive matmul_tflops and memory_gbps");
  for (auto& [name, r] : t.per_op) r.rate *= r.by_flops ? f : b;
  t.matmul_flops *= f;
  t.memory_bytes *= b;
  t.depthwise_bytes *= b;
  t.host_bytes = number(to, "host_optimizer_gbps", 10) * 1e9;
  t.measured = false;
  const std::string source = t.provenance.substr(t.provenance.find(": ") + 2);
  t.device = to.value("device", std::string("(unnamed device)"));
  t.provenance =
      fmt::format("scaled: {} to {} by peak FLOP rate x{:.3g} and byte rate x{:.3g}", source, t.device, f, b);
  return t;
}

}  // namespace

double ComputeTable::seconds(const OpCost& op) const {
  if (const auto it = per_op.find(op.name); it != per_op.end())
    return (it->second.by_flops ? op.flops : op.bytes) / it->second.rate;
  switch (op.cls) {
    case OpClass::matmul:
      return std::max(op.flops / matmul_flops, op.bytes / memory_bytes) + op_overhead_s;
    case OpClass::depthwise:
      return op.bytes / depthwise_bytes + op_overhead_s;
    case OpClass::memory:
      break;
  }
  return op.bytes / memory_bytes + op_overhead_s;
}

ComputeTable::CommCpu comm_cpu_from_json(const nlohmann::json& j) {
  ComputeTable::CommCpu c;
  if (!j.contains("comm_cpu")) return c;
  const nlohmann::json& k = j.at("comm_cpu");
  CZ_CHECK(k.is_object(), "compute table: 'comm_cpu' must be an object");
  for (const auto& [key, v] : k.items())
    CZ_CHECK(key == "network_gbps" || key == "shared_memory_gbps" || key == "reduce_gbps" ||
                 key == "step_us" || key == "source",
             "compute table: unknown key comm_cpu.{} (known: network_gbps, shared_memory_gbps, reduce_gbps, "
             "step_us, source)",
             key);
  c.network_bytes = number(k, "network_gbps", 0) * 1e9;
  c.shared_bytes = number(k, "shared_memory_gbps", 0) * 1e9;
  c.reduce_bytes = number(k, "reduce_gbps", 0) * 1e9;
  c.step_s = number(k, "step_us", 0) * 1e-6;
  CZ_CHECK(c.step_s >= 0, "compute table: comm_cpu.step_us must not be negative, got {}", k.dump());
  CZ_CHECK(c.network_bytes > 0 && c.shared_bytes > 0 && c.reduce_bytes > 0,
           "compute table: comm_cpu needs positive network_gbps, shared_memory_gbps and reduce_gbps, got {}",
           k.dump());
  return c;
}

ComputeTable compute_table_from_json(const nlohmann::json& j, DType compute) {
  CZ_CHECK(j.is_object(), "compute table: expected a JSON object");
  ComputeTable t = j.contains("profile") ? scaled(j, compute)
                   : j.contains("ops")   ? from_profile(j)
                                         : from_rates(j, compute);
  t.comm_cpu = comm_cpu_from_json(j);
  if (t.comm_cpu.any())
    t.provenance += fmt::format(
        "; messages on the rank's cores at {:.2f} GB/s network, {:.2f} GB/s shared memory, {:.2f} GB/s "
        "reductions, {:.0f} us a ring step",
        t.comm_cpu.network_bytes / 1e9, t.comm_cpu.shared_bytes / 1e9, t.comm_cpu.reduce_bytes / 1e9,
        t.comm_cpu.step_s * 1e6);
  return t;
}

ComputeTable load_compute_table(const std::string& path, DType compute) {
  std::ifstream in(path);
  CZ_CHECK_IO(in.good(), "--compute-table {}: cannot read it", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(fmt::format("--compute-table {}: not JSON ({})", path, e.what()));
  }
  return compute_table_from_json(j, compute);
}

ComputeTable default_compute_table(DType compute) {
  return from_rates(nlohmann::json::parse(kRtx4090), compute);
}

}  // namespace cz::plan
