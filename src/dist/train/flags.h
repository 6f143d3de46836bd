// The flags of convnext_zero, each declared once (flags_<section>.cpp, flags_table.h) with its help, the
// TrainConfig field it sets, its check and what else reads it; the CLI, TrainConfig::validate, the
// rank-agreement check, the resume identity and the config JSON all iterate this one table (llama.cpp's
// common/arg.cpp does the same for its options).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dist/comm/types.h"
#include "dist/train/config.h"
#include "dist/zero/engine.h"

namespace cz::train {

// The TrainConfig field a flag sets. A bool field is a switch: giving the flag sets it to true, or to false
// for an inverted one (--no-shuffle sets `shuffle`).
using FlagField =
    std::variant<std::string TrainConfig::*, std::vector<int64_t> TrainConfig::*, int64_t TrainConfig::*,
                 uint64_t TrainConfig::*, int TrainConfig::*, double TrainConfig::*, bool TrainConfig::*>;

// The sections of --help, in this order (as timm's train.py and torchrun group theirs).
inline constexpr const char* kModelGroup = "Model and weights";
inline constexpr const char* kDataGroup = "Data and evaluation";
inline constexpr const char* kAugmentGroup = "Augmentation and regularisation";
inline constexpr const char* kOptimGroup = "Optimizer and schedule";
inline constexpr const char* kDeviceGroup = "Device and precision";
inline constexpr const char* kZeroGroup = "Distributed and ZeRO";
inline constexpr const char* kOutputGroup = "Checkpoints, logs and progress";
inline constexpr const char* kFlagGroups[] = {kModelGroup,  kDataGroup, kAugmentGroup, kOptimGroup,
                                              kDeviceGroup, kZeroGroup, kOutputGroup};

struct Flag {
  const char* name;  // with its dashes, as typed: the only place the name is spelled
  FlagField field;
  const char* group = nullptr;  // its section of --help: one of kFlagGroups
  std::string help;
  bool inverted = false;  // a switch that sets its bool field to false
  // Throws ValueError naming the flag (`self` is this entry); empty: any value the parser accepts.
  std::function<void(const TrainConfig& c, const Flag& self)> check = nullptr;
  // Every rank of a job must be given the same value (Trainer::check_ranks_agree).
  bool ranks_agree = false;
  // Part of the resume identity (Note [Resuming]): a resumed run must have the saved value. The value as a
  // checkpoint records it: the flag's value where `resume_spelling` is empty.
  bool resume_identity = false;
  std::function<std::string(const TrainConfig& c)> resume_spelling = nullptr;
  const char* json_key = nullptr;  // its key in the checkpoint's config JSON; null: not recorded
};

// Every flag, in the order of --help.
const std::vector<Flag>& flags();
// The Mixup/CutMix, --dump-batches, --interpolation, RandAugment and random-erasing entries
// (flags_augment.cpp), which flags() places after --augment.
std::vector<Flag> augment_flags();

// The entry that sets `field` (a bug if there is none), and its name, for messages and CLI look-ups:
// flag_name(&TrainConfig::steps) is "--steps".
const Flag& flag_of(const FlagField& field);
inline const char* flag_name(const FlagField& field) {
  return flag_of(field).name;
}

// The entry named `name` ("--lr"), or null.
const Flag* find_flag(const std::string& name);
// Sets the flag's field from text as a command line gives it: numbers, lists "a,b,c", switches "true" /
// "false" (the field's value, also for an inverted switch). Throws ValueError naming the flag.
void set_flag_value(TrainConfig& c, const Flag& f, const std::string& value);

// The flag's value as text: numbers as fmt prints them, lists joined with ",".
std::string flag_value(const TrainConfig& c, const Flag& f);
// The flag and its value as a command line has them, for messages: "--data h5:train.h5".
std::string flag_arg(const TrainConfig& c, const FlagField& field);

// (flag, value) for each flag of the resume identity, as a checkpoint records them ("--dims", "8,16,24,32").
std::vector<std::pair<std::string, std::string>> resume_identity(const TrainConfig& c);

// The run's configuration as the checkpoint records it for people and tools, one JSON object.
std::string config_json(const TrainConfig& c, int world);
// Every flag's value, keyed by the flag's name without its dashes, a switch as given ("no-shuffle": true):
// the log's start record.
nlohmann::json flags_json(const TrainConfig& c);

// Configurations derived from the flags, each in one place.
// --bucket-mb in bytes, at least one.
int64_t bucket_bytes(double bucket_mb);
// The dtype the model computes in: --precision on CUDA; on the CPU fp32, bf16 meaning bf16 GEMMs in an fp32
// model (cpu_bf16_gemms) and fp16 refused.
DType compute_dtype(const TrainConfig& c, bool cuda);
// --precision bf16 on the CPU: every GEMM multiplies bf16-rounded operands with fp32 accumulation, the rest
// of the model, its gradients and the master weights stay fp32 (Note [bf16 on the CPU] in
// tensor/cpu/gemm_bf16.cpp); the engine keeps no 16-bit copies.
bool cpu_bf16_gemms(const TrainConfig& c, bool cuda);
// --reduce-dtype int8: gradients reduced as INT8 records (Note [Quantized reduction]). The one place that
// reads the flag's int8 value.
bool reduces_int8(const TrainConfig& c);
// --reduce-dtype as the gradient buckets' dtype (f32 for int8, whose records are made from f32 buckets).
DType reduce_bucket_dtype(const TrainConfig& c);
// --gather-dtype as ZeroConfig::gather_dtype: f32, bf16, f16, or u8 for INT8 blocks.
DType gather_wire_dtype(const TrainConfig& c);
// --comm-impl as the world communicator's algorithm: flat is the ring, hier and auto as named.
dist::Algorithm world_algorithm(const TrainConfig& c);
// The ZeRO engine's configuration for a run on `device`.
zero::ZeroConfig zero_config(const TrainConfig& c, Device device);

}  // namespace cz::train
