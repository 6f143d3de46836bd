// The flag table's sections (flags.h has the table and what reads it): one function per --help section, each
// in its own file, concatenated by flags() in kFlagGroups' order.
#pragma once

#include <string>
#include <vector>

#include "dist/train/flags.h"

namespace cz::train {

std::vector<Flag> model_flags();          // flags_model.cpp
std::vector<Flag> data_flags();           // flags_data.cpp
std::vector<Flag> augment_group_flags();  // flags_augment.cpp (with augment_flags() after --augment)
std::vector<Flag> optim_flags();          // flags_optim.cpp
std::vector<Flag> device_flags();         // flags_device.cpp
std::vector<Flag> zero_flags();           // flags_zero.cpp
std::vector<Flag> output_flags();         // flags_output.cpp

// "fp32" | "fp16" | "bf16"
bool is_dtype_flag(const std::string& v);

}  // namespace cz::train
