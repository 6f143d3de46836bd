// The flag table, and what is read from it: validation, the resume identity, the config JSON and the
// configurations derived from the flags. A new flag is one entry in its section's file (flags_table.h) plus
// the code that uses its field.
#include "dist/train/flags_table.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dist/comm/mesh.h"
#include "dist/train/recipe.h"
#include "dist/train/step_tracer.h"
#include "dist/zero/schedule.h"
#include "tensor/check.h"

namespace cz::train {
namespace {

using C = const TrainConfig&;
using F = const Flag&;
using T = TrainConfig;

// The table in --help's sections, each section's entries in their own file (flags_<section>.cpp). Checks run
// in this order, the first that fails naming its flag; a check that reads another flag's field comes after
// that flag's (a section after the sections it reads, or later in its own).
std::vector<Flag> make_flags() {
  std::vector<Flag> t;
  for (std::vector<Flag> (*section)() :
       {model_flags, data_flags, augment_group_flags, optim_flags, device_flags, zero_flags, output_flags}) {
    std::vector<Flag> part = section();
    t.insert(t.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return t;
}

}  // namespace

bool is_dtype_flag(const std::string& v) {
  return v == "fp32" || v == "fp16" || v == "bf16";
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = [] { return make_flags(); }();
  return table;
}

const Flag& flag_of(const FlagField& field) {
  const auto& t = flags();
  const auto it = std::find_if(t.begin(), t.end(), [&](const Flag& f) { return f.field == field; });
  CZ_ASSERT(it != t.end(), "a TrainConfig field without a flag");
  return *it;
}

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : flags())
    if (name == f.name) return &f;
  return nullptr;
}

void set_flag_value(TrainConfig& c, const Flag& f, const std::string& value) {
  // The whole of `text` as a number, by `parse` (std::stod and the like).
  const auto number = [&](const std::string& text, auto parse) {
    size_t used = 0;
    try {
      const auto v = parse(text, &used);
      if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
    throw ValueError(fmt::format("{}: '{}' is not a number", f.name, text));
  };
  const auto stoll = [](const std::string& s, size_t* n) { return std::stoll(s, n); };
  std::visit(
      [&](auto member) {
        auto& v = c.*member;
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) {
          v = value;
        } else if constexpr (std::is_same_v<V, bool>) {
          CZ_CHECK(value == "true" || value == "false", "{}: expected true or false, got '{}'", f.name,
                   value);
          v = value == "true";
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          v.clear();
          size_t b = 0;
          while (!value.empty()) {
            const size_t e = std::min(value.find(',', b), value.size());
            v.push_back(number(value.substr(b, e - b), stoll));
            if (e == value.size()) break;
            b = e + 1;
          }
        } else if constexpr (std::is_same_v<V, double>) {
          v = number(value, [](const std::string& s, size_t* n) { return std::stod(s, n); });
        } else if constexpr (std::is_same_v<V, uint64_t>) {
          v = number(value, [](const std::string& s, size_t* n) { return std::stoull(s, n); });
        } else {
          v = V(number(value, stoll));
        }
      },
      f.field);
}

std::string flag_value(const TrainConfig& c, const Flag& f) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = c.*member;
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>)
          return v;
        else if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<int64_t>>)
          return fmt::format("{}", fmt::join(v, ","));
        else
          return fmt::format("{}", v);
      },
      f.field);
}

std::string flag_arg(const TrainConfig& c, const FlagField& field) {
  const Flag& f = flag_of(field);
  return fmt::format("{} {}", f.name, flag_value(c, f));
}

void TrainConfig::validate() const {
  for (const Flag& f : flags())
    if (f.check) f.check(*this, f);
}

std::vector<std::pair<std::string, std::string>> resume_identity(const TrainConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Flag& f : flags())
    if (f.resume_identity)
      out.emplace_back(f.name, f.resume_spelling ? f.resume_spelling(c) : flag_value(c, f));
  return out;
}

std::string config_json(const TrainConfig& c, int world) {
  nlohmann::json j = {{"world_size", world}};
  for (const Flag& f : flags())
    if (f.json_key) std::visit([&](auto member) { j[f.json_key] = c.*member; }, f.field);
  return j.dump();
}

nlohmann::json flags_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const Flag& f : flags())
    std::visit(
        [&](auto member) {
          nlohmann::json v = c.*member;
          if (f.inverted) v = !v.template get<bool>();
          j[std::string(f.name).substr(2)] = std::move(v);
        },
        f.field);
  return j;
}

int64_t bucket_bytes(double bucket_mb) {
  return std::max<int64_t>(1, int64_t(bucket_mb * (1 << 20)));
}

DType compute_dtype(const TrainConfig& c, bool cuda) {
  const DType d = dtype_of_flag(c.precision);
  if (cuda) return d;
  CZ_CHECK(d != DType::f16,
           "{} fp16 needs {} cuda (the CPU backend has no fp16 compute; {} bf16 runs the CPU's GEMMs in bf16 "
           "where it has AVX512_BF16 or AMX)",
           flag_name(&T::precision), flag_name(&T::device), flag_name(&T::precision));
  return DType::f32;
}

bool cpu_bf16_gemms(const TrainConfig& c, bool cuda) {
  return !cuda && dtype_of_flag(c.precision) == DType::bf16;
}

bool reduces_int8(const TrainConfig& c) {
  return c.reduce_dtype == "int8";
}

DType reduce_bucket_dtype(const TrainConfig& c) {
  return reduces_int8(c) ? DType::f32 : dtype_of_flag(c.reduce_dtype);
}

DType gather_wire_dtype(const TrainConfig& c) {
  return c.gather_dtype == "int8" ? DType::u8 : dtype_of_flag(c.gather_dtype);
}

dist::Algorithm world_algorithm(const TrainConfig& c) {
  if (c.comm_impl == "flat") return dist::Algorithm::ring;
  return c.comm_impl == "hier" ? dist::Algorithm::hier : dist::Algorithm::automatic;
}

zero::ZeroConfig zero_config(const TrainConfig& c, Device device) {
  zero::ZeroConfig z;
  z.stage = c.stage;
  z.bucket_bytes = bucket_bytes(c.bucket_mb);
  z.prefetch = c.prefetch;
  z.compute_dtype = compute_dtype(c, device.is_cuda());
  z.reduce_dtype = reduce_bucket_dtype(c);
  z.reduce_int8 = reduces_int8(c);
  z.gather_dtype = gather_wire_dtype(c);
  z.device = device;
  z.offload = c.offload_optimizer;
  z.offload_overlap_step = c.offload_overlap_step;
  z.hpz = c.hpz;
  return z;
}

}  // namespace cz::train
