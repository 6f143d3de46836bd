// Round-trip error of the block-quantized INT8 format (Note [Quantized blocks]) per block size, on
// weight-like and gradient-like data: a ConvNeXt-atto's timm initialisation and its gradient after one
// forward/backward on random images (both flat, in parameter order, as ZeRO's buffers hold them, so blocks
// straddle tensors), plus normal and heavy-tailed (Student t, 3 degrees of freedom) samples. Prints the
// markdown table of docs/zero.md. With --reduction: the error of the quantized gradient reductions
// (Note [Quantized reduction], Note [Two-hop quantized reduction]) on N = H x R ranks' atto gradients (each
// rank's own random batch), flat all-to-all against two hops, relative to the exact mean.
//   build/bench/quant_error [--image 64] [--batch 16] [--reduction]
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dist/comm/quant.h"
#include "nn/convnext.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace {

using cz::dist::quant_scale_count;

struct Piece {
  std::string name;
  int64_t first = 0, count = 0;
};
struct DataSet {
  std::string name;
  std::vector<float> values;
  std::vector<Piece> pieces;  // tensors inside the buffer (model data only)
};

struct Errors {
  double rel_l2 = 0;      // ||x - deq|| / ||x|| over the whole buffer
  double worst_rel = 0;   // the worst tensor's ||x - deq|| / ||x||
  std::string worst;      // which tensor
  double max_over_s = 0;  // max |x - deq| / s (the bound is 1/2)
};

// aligned: every tensor starts a block (as a flat layout aligned to B elements would make it), so no block
// mixes two tensors; the padding is counted in the wire bytes.
Errors measure(const DataSet& d, int64_t block, bool aligned, int bits, double& wire_bytes) {
  const auto n = int64_t(d.values.size());
  std::vector<float> y(static_cast<size_t>(n)), scale_of(static_cast<size_t>(n));
  std::vector<Piece> parts = aligned ? d.pieces : std::vector<Piece>{{"", 0, n}};
  double bytes = 0;
  for (const Piece& p : parts) {
    const int64_t blocks = quant_scale_count(p.count, block);
    std::vector<int8_t> q(static_cast<size_t>(p.count));
    std::vector<uint8_t> q4(static_cast<size_t>(cz::dist::quant4_code_bytes(p.count)));
    std::vector<float> s(static_cast<size_t>(blocks));
    if (bits == 8) {
      cz::dist::quantize(cz::DType::f32, d.values.data() + p.first, p.count, block, q.data(), s.data());
      cz::dist::dequantize(q.data(), s.data(), p.count, block, cz::DType::f32, y.data() + p.first);
    } else {
      cz::dist::quantize_int4(cz::DType::f32, d.values.data() + p.first, p.count, block, q4.data(), s.data());
      cz::dist::dequantize_int4(q4.data(), s.data(), p.count, block, cz::DType::f32, y.data() + p.first);
    }
    for (int64_t i = 0; i < p.count; ++i) scale_of[size_t(p.first + i)] = s[size_t(i / block)];
    bytes += double(aligned ? blocks * block : p.count) * bits / 8.0 + 4.0 * double(blocks);
  }
  wire_bytes = bytes / double(n);
  Errors e;
  auto rel = [&](int64_t first, int64_t count) {
    double num = 0, den = 0;
    for (int64_t i = first; i < first + count; ++i) {
      const double x = d.values[size_t(i)], err = x - y[size_t(i)];
      num += err * err;
      den += x * x;
    }
    return den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  };
  e.rel_l2 = rel(0, n);
  for (const Piece& p : d.pieces) {
    const double r = rel(p.first, p.count);
    if (r > e.worst_rel) e.worst_rel = r, e.worst = p.name;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float sc = scale_of[size_t(i)];
    if (sc > 0)
      e.max_over_s = std::max(e.max_over_s, std::fabs(double(d.values[size_t(i)]) - y[size_t(i)]) / sc);
  }
  return e;
}

// The model's parameters and their gradients after one step, flat in parameter order.
void model_data(int64_t image, int64_t batch, DataSet& weights, DataSet& grads) {
  cz::nn::ConvNeXt model(cz::nn::convnext_variant("atto"));
  model.init_weights(0);
  cz::Generator gen(1);
  const cz::Tensor x = cz::randn({batch, image, image, 3}, gen);
  const cz::Tensor labels = cz::randint(model.config().num_classes, {batch}, gen);
  cz::cross_entropy(model.forward(x), labels, 0.1).backward();
  weights.name = "atto weights (timm init)";
  grads.name = "atto gradient (1 step)";
  for (const auto& [name, p] : model.named_parameters()) {
    const cz::Tensor w = p.contiguous(), g = p.grad().contiguous();
    const Piece piece{name, int64_t(weights.values.size()), p.numel()};
    weights.values.insert(weights.values.end(), w.data<float>(), w.data<float>() + p.numel());
    grads.values.insert(grads.values.end(), g.data<float>(), g.data<float>() + p.numel());
    weights.pieces.push_back(piece);
    grads.pieces.push_back(piece);
  }
}

// acc[0, n) += deq(Q(x[0, n))), as an owner adds a record (one fma per value).
void add_record(const float* x, float* acc, int64_t n, int64_t block) {
  std::vector<int8_t> q(static_cast<size_t>(n));
  std::vector<float> s(static_cast<size_t>(quant_scale_count(n, block)));
  cz::dist::quantize(cz::DType::f32, x, n, block, q.data(), s.data());
  cz::dist::dequantize_add_quantize(q.data(), s.data(), acc, n, block, nullptr, nullptr, acc);
}

// The reduced mean of grads[0 .. H R) (rank h R + l is local rank l of host h) as the owner local rank 0 of
// host 0 computes it: flat (its values plus every other rank's record) or in two hops (each host's partial,
// its own values plus its host peers' records; the other hosts' partials as one record each).
std::vector<float> reduce(const std::vector<std::vector<float>>& g, int hosts, int per_host, bool two_hop,
                          int64_t block) {
  const auto n = int64_t(g[0].size());
  std::vector<float> out = g[0];
  if (!two_hop) {
    for (size_t r = 1; r < g.size(); ++r) add_record(g[r].data(), out.data(), n, block);
  } else {
    for (int h = 0; h < hosts; ++h) {
      std::vector<float> p = g[size_t(h * per_host)];
      for (int l = 1; l < per_host; ++l) add_record(g[size_t(h * per_host + l)].data(), p.data(), n, block);
      if (h == 0)
        out = p;
      else
        add_record(p.data(), out.data(), n, block);
    }
  }
  for (float& v : out) v *= 1.f / float(g.size());
  return out;
}

// Stage 0's all-reduce (Note [Quantized all-reduce], Note [Two-hop quantized all-reduce]): the owner's mean
// once more through a record, as every rank decodes it.
std::vector<float> round_trip(const std::vector<float>& x, int64_t block) {
  std::vector<float> out(x.size(), 0.f);
  add_record(x.data(), out.data(), int64_t(x.size()), block);
  return out;
}

void reduction_errors(int64_t image, int64_t batch) {
  constexpr int kRanks = 8;
  std::vector<std::vector<float>> g;
  for (int r = 0; r < kRanks; ++r) {
    cz::nn::ConvNeXt model(cz::nn::convnext_variant("atto"));
    model.init_weights(0);
    cz::Generator gen(uint64_t(100 + r));
    const cz::Tensor x = cz::randn({batch, image, image, 3}, gen);
    const cz::Tensor labels = cz::randint(model.config().num_classes, {batch}, gen);
    cz::cross_entropy(model.forward(x), labels, 0.1).backward();
    std::vector<float> v;
    for (const auto& [name, p] : model.named_parameters()) {
      const cz::Tensor gp = p.grad().contiguous();
      v.insert(v.end(), gp.data<float>(), gp.data<float>() + p.numel());
    }
    g.push_back(std::move(v));
  }
  std::printf(
      "quant_error --reduction: atto gradients of %d ranks (%lld px, batch %lld each), B = 256; error "
      "of the reduced mean against the exact one (f64)\n\n",
      kRanks, (long long)image, (long long)batch);
  std::printf(
      "| hosts x ranks | reduce-scatter: flat all-to-all rel. L2 | two hops rel. L2 | two hops / flat | "
      "stage-0 all-reduce: flat | two hops | two hops / flat |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{2, 4}, std::pair{4, 2}}) {
    const std::vector<std::vector<float>> mine(g.begin(), g.begin() + hosts * per_host);
    const auto n = int64_t(mine[0].size());
    std::vector<double> exact(static_cast<size_t>(n), 0.0);
    for (const auto& v : mine)
      for (int64_t i = 0; i < n; ++i) exact[size_t(i)] += v[size_t(i)] / double(mine.size());
    double err[4] = {0, 0, 0, 0}, den = 0;  // reduce-scatter flat, two hops; all-reduce flat, two hops
    for (int two : {0, 1}) {
      const std::vector<float> y = reduce(mine, hosts, per_host, two == 1, 256), all = round_trip(y, 256);
      for (int64_t i = 0; i < n; ++i) {
        const double e = y[size_t(i)] - exact[size_t(i)], ea = all[size_t(i)] - exact[size_t(i)];
        err[two] += e * e;
        err[2 + two] += ea * ea;
        if (two == 0) den += exact[size_t(i)] * exact[size_t(i)];
      }
    }
    std::printf("| %d x %d | %.3f%% | %.3f%% | %.2fx | %.3f%% | %.3f%% | %.2fx |\n", hosts, per_host,
                100 * std::sqrt(err[0] / den), 100 * std::sqrt(err[1] / den), std::sqrt(err[1] / err[0]),
                100 * std::sqrt(err[2] / den), 100 * std::sqrt(err[3] / den), std::sqrt(err[3] / err[2]));
  }
}

DataSet sample(const std::string& name, int64_t n, bool heavy) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::student_t_distribution<float> t3(3.f);
  DataSet d{name, std::vector<float>(static_cast<size_t>(n)), {}};
  for (auto& v : d.values) v = heavy ? t3(gen) * 1e-3f : normal(gen) * 0.02f;
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t image = 64, batch = 16;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--reduction") {
      for (int j = 1; j + 1 < argc; ++j) {
        if (std::string(argv[j]) == "--image") image = std::stoll(argv[j + 1]);
        if (std::string(argv[j]) == "--batch") batch = std::stoll(argv[j + 1]);
      }
      reduction_errors(image, batch);
      return 0;
    }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--image") image = std::stoll(argv[i + 1]);
    if (a == "--batch") batch = std::stoll(argv[i + 1]);
  }
  DataSet weights, grads;
  model_data(image, batch, weights, grads);
  const int64_t n = int64_t(weights.values.size());
  std::vector<DataSet> sets = {std::move(weights), std::move(grads), sample("normal(0, 0.02)", n, false),
                               sample("Student t3 x 1e-3", n, true)};
  std::printf("quant_error: %lld values per data set (ConvNeXt-atto, %lld px, batch %lld)\n\n", (long long)n,
              (long long)image, (long long)batch);
  std::printf(
      "| data | B | wire bytes/value | vs f32 | rel. L2 error | worst tensor (rel. L2) | max err / s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int bits : {8, 4})
    for (const DataSet& d : sets)
      for (bool aligned : {false, true}) {
        if (aligned && d.pieces.empty()) continue;
        for (int64_t block : {32, 64, 128, 256, 512, 1024, 4096}) {
          if (bits == 4 && block > 256) continue;
          double wire = 0;
          const Errors e = measure(d, block, aligned, bits, wire);
          const std::string worst =
              e.worst.empty() ? "-" : fmt::format("{} ({:.2f}%)", e.worst, 100 * e.worst_rel);
          std::printf("| %s%s%s | %lld | %.4f | %.2fx | %.3f%% | %s | %.4f |\n", bits == 4 ? "INT4: " : "",
                      d.name.c_str(), aligned ? ", blocks aligned to tensors" : "", (long long)block, wire,
                      4.0 / wire, 100 * e.rel_l2, worst.c_str(), e.max_over_s);
        }
      }
  return 0;
}
