// AdamW and SGD: against PyTorch (a committed fixture from tools/make_optim_fixture.py) and against a naive
// f64 loop; sharded updates equal the unsharded one bit for bit; state round trips; bad configurations.
#include <omp.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "optim/adamw.h"
#include "optim/sgd.h"
#include "optim_testing.h"

namespace cz {
namespace {

using testing::all_close;
using testing::random_flat;
using testing::throws_with;

// ---- PyTorch fixture ----

struct Fixture {
  nlohmann::json j;
  FlatParams flat;
  std::vector<std::pair<std::string, Tensor>> params;
};

Fixture load_fixture() {
  std::ifstream in(CZ_OPTIM_FIXTURE);
  EXPECT_TRUE(in.good()) << "cannot open " << CZ_OPTIM_FIXTURE;
  Fixture f;
  f.j = nlohmann::json::parse(in);
  for (const auto& p : f.j["params"]) {
    Shape shape = p["shape"].get<Shape>();
    f.params.emplace_back(p["name"],
                          from_vector(p["value"].get<std::vector<float>>(), shape).set_requires_grad(true));
  }
  f.flat = flatten_parameters(f.params, 16);
  return f;
}

void set_grads(Fixture& f, int step) {
  const auto& g = f.j["grads"][size_t(step)];
  for (size_t i = 0; i < f.params.size(); ++i) {
    const FlatSegment& s = f.flat.layout.segments[i];
    f.flat.grads.narrow(0, s.offset, s.numel).copy_(from_vector(g[i].get<std::vector<float>>(), {s.numel}));
  }
}

// Compares every parameter (or a per-segment state vector) with the fixture's values for it.
void expect_segments(const Fixture& f, const Tensor& flat, const nlohmann::json& expected,
                     const std::string& what) {
  for (size_t i = 0; i < f.params.size(); ++i) {
    const FlatSegment& s = f.flat.layout.segments[i];
    const Tensor want = from_vector(expected[i].get<std::vector<float>>(), {s.numel});
    EXPECT_TRUE(all_close(flat.narrow(0, s.offset, s.numel), want, 1e-6, 1e-8)) << what << " of " << s.name;
  }
}

TEST(AdamW, MatchesTorchOverThreeSteps) {
  Fixture f = load_fixture();
  const auto& a = f.j["adamw"];
  AdamW opt(f.flat.layout, ShardRange::whole(f.flat.layout),
            timm_weight_decay(f.flat.layout, a["weight_decay"]), {a["beta1"], a["beta2"], a["eps"]});
  for (int s = 0; s < 3; ++s) {
    set_grads(f, s);
    opt.step(f.flat.params, f.flat.grads, f.j["lrs"][size_t(s)]);
    expect_segments(f, f.flat.params, a["expected"][size_t(s)], "params after step " + std::to_string(s + 1));
  }
  expect_segments(f, opt.exp_avg(), a["state"]["exp_avg"], "exp_avg");
  expect_segments(f, opt.exp_avg_sq(), a["state"]["exp_avg_sq"], "exp_avg_sq");
  EXPECT_EQ(opt.step_count(), 3);
}

TEST(SGD, MatchesTorchWithMomentumAndNesterov) {
  for (const char* key : {"sgd", "sgd_nesterov"}) {
    SCOPED_TRACE(key);
    Fixture f = load_fixture();
    const auto& c = f.j[key];
    SgdConfig config;
    config.momentum = c["momentum"];
    config.nesterov = c["nesterov"];
    Sgd opt(f.flat.layout, ShardRange::whole(f.flat.layout),
            timm_weight_decay(f.flat.layout, c["weight_decay"]), config);
    for (int s = 0; s < 3; ++s) {
      set_grads(f, s);
      opt.step(f.flat.params, f.flat.grads, f.j["lrs"][size_t(s)]);
      expect_segments(f, f.flat.params, c["expected"][size_t(s)],
                      "params after step " + std::to_string(s + 1));
    }
    expect_segments(f, opt.momentum_buffer(), c["state"]["momentum_buffer"], "momentum_buffer");
  }
}

// ---- naive f64 reference loops ----

struct Naive {
  std::vector<double> p, m, v, wd, lr_scale;
  int64_t t = 0;

  Naive(const FlatParams& flat, const std::vector<ParamHyper>& hyper)
      : p(flat.params.to_vector<double>()),
        m(p.size(), 0.0),
        v(p.size(), 0.0),
        wd(p.size()),
        lr_scale(p.size()) {
    // Padding belongs to the parameter before it (Note [Shard pieces]).
    const auto& segs = flat.layout.segments;
    for (size_t k = 0; k < segs.size(); ++k) {
      const int64_t end = k + 1 < segs.size() ? segs[k + 1].offset : flat.layout.numel;
      for (int64_t i = segs[k].offset; i < end; ++i) {
        wd[size_t(i)] = hyper[k].weight_decay;
        lr_scale[size_t(i)] = hyper[k].lr_scale;
      }
    }
  }

  void adamw(const std::vector<double>& g, double lr, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      const double l = lr * lr_scale[i];
      p[i] *= 1 - l * wd[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(b1, double(t))), v_hat = v[i] / (1 - std::pow(b2, double(t)));
      p[i] -= l * m_hat / (std::sqrt(v_hat) + eps);
    }
  }

  void sgd(const std::vector<double>& g, double lr, double mom, double damp, bool nesterov) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd[i] * p[i];
      m[i] = t == 1 ? d : mom * m[i] + (1 - damp) * d;
      d = nesterov ? d + mom * m[i] : m[i];
      p[i] -= lr * lr_scale[i] * d;
    }
  }
};

std::vector<ParamHyper> mixed_hyper(const FlatLayout& layout) {
  auto h = timm_weight_decay(layout, 0.05);
  h[0].lr_scale = 0.5;  // layer-wise lr decay on the first parameter
  return h;
}

const std::vector<std::pair<std::string, Shape>> kSpecs = {
    {"a.weight", {37, 29}}, {"a.bias", {29}}, {"b.gamma", {50}}, {"c.weight", {100, 200}}, {"c.bias", {200}}};

TEST(AdamW, MatchesNaiveF64LoopInF32AndF64) {
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    FlatParams flat = random_flat(kSpecs, 7, dtype);
    const auto hyper = mixed_hyper(flat.layout);
    Naive ref(flat, hyper);
    AdamW opt(flat.layout, ShardRange::whole(flat.layout), hyper, {}, dtype);
    const double lrs[] = {3e-3, 1e-2, 1e-3, 5e-3};
    for (int s = 0; s < 4; ++s) {
      flat.grads.mul_(s % 2 ? -0.5 : 1.5);  // a different gradient each step
      ref.adamw(flat.grads.to_vector<double>(), lrs[s]);
      opt.step(flat.params, flat.grads, lrs[s]);
    }
    const Tensor want = from_vector(ref.p, {int64_t(ref.p.size())});
    EXPECT_TRUE(
        all_close(flat.params, want, dtype == DType::f64 ? 1e-13 : 1e-6, dtype == DType::f64 ? 1e-15 : 1e-8));
    EXPECT_TRUE(all_close(opt.exp_avg_sq(), from_vector(ref.v, {int64_t(ref.v.size())}),
                          dtype == DType::f64 ? 1e-13 : 1e-6, 0));
  }
}

TEST(SGD, MatchesNaiveF64Loop) {
  for (bool nesterov : {false, true}) {
    for (double damp : {0.0, 0.3}) {
      if (nesterov && damp != 0) continue;
      SCOPED_TRACE(fmt::format("nesterov {} dampening {}", nesterov, damp));
      FlatParams flat = random_flat(kSpecs, 8, DType::f64);
      const auto hyper = mixed_hyper(flat.layout);
      Naive ref(flat, hyper);
      Sgd opt(flat.layout, ShardRange::whole(flat.layout), hyper, {0.9, damp, nesterov}, DType::f64);
      for (int s = 0; s < 4; ++s) {
        flat.grads.mul_(s % 2 ? -0.5 : 1.5);
        ref.sgd(flat.grads.to_vector<double>(), 0.1, 0.9, damp, nesterov);
        opt.step(flat.params, flat.grads, 0.1);
      }
      EXPECT_TRUE(all_close(flat.params, from_vector(ref.p, {int64_t(ref.p.size())}), 1e-13, 1e-15));
    }
  }
}

// ---- sharding ----

// Runs `steps` updates of an optimizer made by `make(shard)` over each shard separately, with `threads`
// OpenMP threads, and returns the final flat parameters.
template <class Make>
std::vector<float> run_sharded(const std::vector<ShardRange>& shards, int threads, Make make) {
  FlatParams flat = random_flat(kSpecs, 11, DType::f32);
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (ShardRange s : shards) opts.push_back(make(flat.layout, s));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  for (int step = 0; step < 3; ++step) {
    flat.grads.mul_(-1.25);
    for (size_t k = 0; k < shards.size(); ++k) {
      const ShardRange s = shards[k];
      opts[k]->step(flat.params.narrow(0, s.begin, s.numel()), flat.grads.narrow(0, s.begin, s.numel()),
                    1e-2 * (step + 1));
    }
  }
  omp_set_num_threads(saved);
  return flat.params.to_vector<float>();
}

TEST(Sharding, ThreeUnevenShardsEqualOneShardBitForBit) {
  const FlatLayout layout = random_flat(kSpecs, 11, DType::f32).layout;
  const int64_t n = layout.numel;
  // 700 cuts a.weight (37x29 = 1073), 18001 cuts c.weight; sizes are not multiples of the vector width.
  const std::vector<ShardRange> three = {{0, 700}, {700, 18001}, {18001, n}};
  const std::vector<ShardRange> one = {ShardRange::whole(layout)};
  const auto adamw = [](const FlatLayout& l, ShardRange s) {
    return std::make_unique<AdamW>(l, s, mixed_hyper(l));
  };
  const auto sgd = [](const FlatLayout& l, ShardRange s) {
    return std::make_unique<Sgd>(l, s, mixed_hyper(l), SgdConfig{0.9, 0.0, true});
  };
  const auto ref_adamw = run_sharded(one, 1, adamw);
  EXPECT_EQ(run_sharded(three, 1, adamw), ref_adamw);
  EXPECT_EQ(run_sharded(three, 3, adamw), ref_adamw);
  EXPECT_EQ(run_sharded(one, 2, adamw), ref_adamw);
  const auto ref_sgd = run_sharded(one, 1, sgd);
  EXPECT_EQ(run_sharded(three, 2, sgd), ref_sgd);
  EXPECT_EQ(run_sharded(one, 3, sgd), ref_sgd);
}

TEST(Sharding, StateIsLaidOutLikeTheShard) {
  FlatParams flat = random_flat(kSpecs, 12, DType::f32);
  const int64_t n = flat.layout.numel;
  AdamW whole(flat.layout, ShardRange::whole(flat.layout), mixed_hyper(flat.layout));
  AdamW left(flat.layout, {0, 1000}, mixed_hyper(flat.layout));
  AdamW right(flat.layout, {1000, n}, mixed_hyper(flat.layout));
  Tensor p2 = flat.params.clone();
  whole.step(flat.params, flat.grads, 1e-3);
  left.step(p2.narrow(0, 0, 1000), flat.grads.narrow(0, 0, 1000), 1e-3);
  right.step(p2.narrow(0, 1000, n - 1000), flat.grads.narrow(0, 1000, n - 1000), 1e-3);
  EXPECT_EQ(left.exp_avg_sq().to_vector<float>(), whole.exp_avg_sq().narrow(0, 0, 1000).to_vector<float>());
  EXPECT_EQ(right.exp_avg().to_vector<float>(), whole.exp_avg().narrow(0, 1000, n - 1000).to_vector<float>());
  EXPECT_EQ(left.exp_avg().numel(), 1000);
}

// ---- state ----

TEST(State, SaveLoadRoundTripContinuesIdentically) {
  FlatParams flat = random_flat(kSpecs, 13, DType::f32);
  const auto hyper = mixed_hyper(flat.layout);
  const ShardRange shard{500, 9000};
  Tensor p = flat.params.narrow(0, shard.begin, shard.numel()),
         g = flat.grads.narrow(0, shard.begin, shard.numel());
  AdamW a(flat.layout, shard, hyper);
  a.step(p, g, 1e-2);
  a.step(p, g, 1e-2);
  NamedTensors saved;
  for (const auto& [k, t] : a.state()) saved.emplace_back(k, t.clone());  // state() gives live views
  ASSERT_EQ(saved.size(), 3u);
  EXPECT_EQ(saved[0].first, "exp_avg");
  EXPECT_EQ(saved[1].first, "exp_avg_sq");
  EXPECT_EQ(saved[2].first, "step");
  EXPECT_EQ(saved[2].second.item(), 2.0);

  AdamW b(flat.layout, shard, hyper);
  b.load_state(saved);
  EXPECT_EQ(b.step_count(), 2);
  Tensor p2 = p.clone();
  a.step(p, g, 1e-2);
  b.step(p2, g, 1e-2);
  EXPECT_EQ(p.to_vector<float>(), p2.to_vector<float>());

  Sgd s(flat.layout, shard, hyper, {0.9});
  s.step(p, g, 0.1);
  Sgd s2(flat.layout, shard, hyper, {0.9});
  s2.load_state(s.state());
  Tensor p3 = p.clone();
  s.step(p, g, 0.1);
  s2.step(p3, g, 0.1);
  EXPECT_EQ(p.to_vector<float>(), p3.to_vector<float>());
  EXPECT_EQ(Sgd(flat.layout, shard, hyper).state().size(), 1u);  // momentum 0: just "step"
}

TEST(State, LoadRejectsWrongNamesAndShapesAndLeavesStateUntouched) {
  FlatParams flat = random_flat(kSpecs, 14, DType::f32);
  const auto hyper = mixed_hyper(flat.layout);
  AdamW a(flat.layout, {0, 100}, hyper);
  const Tensor good = full({100}, 0.5), step = from_vector(std::vector<int64_t>{4}, {});
  EXPECT_TRUE(throws_with<IoError>(
      [&] {
        a.load_state({{"exp_avg", good}, {"step", step}});
      },
      {"missing", "exp_avg_sq"}));
  EXPECT_TRUE(throws_with<IoError>(
      [&] {
        a.load_state({{"exp_avg", good}, {"exp_avg_sq", full({99}, 1.0)}, {"step", step}});
      },
      {"exp_avg_sq", "(99)", "[0, 100)"}));
  EXPECT_TRUE(throws_with<IoError>(
      [&] {
        a.load_state({{"momentum_buffer", good}, {"exp_avg", good}, {"exp_avg_sq", good}, {"step", step}});
      },
      {"unexpected", "momentum_buffer"}));
  EXPECT_EQ(a.exp_avg().to_vector<float>(), std::vector<float>(100, 0.0f));
  EXPECT_EQ(a.step_count(), 0);
  a.load_state({{"exp_avg", good}, {"exp_avg_sq", good}, {"step", step}});
  EXPECT_EQ(a.exp_avg().to_vector<float>(), std::vector<float>(100, 0.5f));
  EXPECT_EQ(a.step_count(), 4);
}

// ---- bad configuration and arguments ----

TEST(Errors, BadConfigurationNamesTheFieldAndValue) {
  FlatParams flat = random_flat(kSpecs, 15, DType::f32);
  const FlatLayout& l = flat.layout;
  const auto h = timm_weight_decay(l, 0.05);
  const ShardRange all = ShardRange::whole(l);
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        AdamW(l, all, h, {1.0, 0.999, 1e-8});
      },
      {"AdamW", "beta1", "1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { AdamW(l, all, h, {0.9, -0.1, 1e-8}); }, {"beta2", "-0.1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { AdamW(l, all, h, {0.9, 0.999, -1.0}); }, {"eps", "-1"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        AdamW(l, {0, l.numel + 1}, h);
      },
      {"AdamW", fmt::format("[0, {})", l.numel + 1), std::to_string(l.numel)}));
  EXPECT_TRUE(throws_with<ValueError>([&] { AdamW(l, {-3, 10}, h); }, {"[-3, 10)"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { Sgd(l, all, h, {1.5}); }, {"SGD", "momentum", "1.5"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        Sgd(l, all, h, {0.9, 0.5, true});
      },
      {"nesterov", "dampening 0.5"}));
  EXPECT_TRUE(throws_with<DtypeError>([&] { AdamW(l, all, h, {}, DType::bf16); }, {"bf16"}));

  AdamW opt(l, {0, 100}, h);
  Tensor p = flat.params.narrow(0, 0, 100), g = flat.grads.narrow(0, 0, 100);
  EXPECT_TRUE(throws_with<ValueError>([&] { opt.step(p, g, -0.1); }, {"AdamW.step", "lr", "-0.1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { opt.step(p, g, NAN); }, {"lr", "nan"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { opt.step(p, flat.grads.narrow(0, 0, 99), 1e-3); },
                                      {"grads", "(99)", "[0, 100)", "100 elements"}));
  EXPECT_TRUE(throws_with<ShapeError>([&] { opt.step(p.view({10, 10}), g, 1e-3); }, {"params", "(10, 10)"}));
  EXPECT_TRUE(throws_with<DtypeError>([&] { opt.step(p, g.to(DType::f64), 1e-3); }, {"grads", "f64", "f32"}));
  EXPECT_EQ(opt.step_count(), 0);  // nothing happened
}

}  // namespace
}  // namespace cz
