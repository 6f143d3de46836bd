// The command line of convnext_zero: the flag table (flags.h) registered with CLI11, in --help's sections,
// and --help wrapped at the terminal's width.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "dist/train/config.h"

namespace cz::train {

// Note [Flags given twice]: every option takes the last value it is given, as argparse (timm, torchrun) does,
// so that a printed resume command can be extended by appending `--steps N`. Set before any option is added:
// CLI11 copies the policy into each option it creates.
void take_last_values(CLI::App& app);
// Every flag of the table into `c`, section by section (kFlagGroups, then any flag without one).
void add_flags(CLI::App& app, TrainConfig& c);

// The width --help wraps at: $COLUMNS when set (as argparse reads it), else stdout's terminal's, else 80.
size_t help_width();
// CLI11's formatter, with each option's description, the description and the footer wrapped at `width`.
class WrappingFormatter : public CLI::Formatter {
 public:
  explicit WrappingFormatter(size_t width);
  std::string make_option(const CLI::Option* opt, bool is_positional) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_footer(const CLI::App* app) const override;
  // One blank line between sections (CLI11's own put two).
  std::string make_group(std::string group, bool is_positional,
                         std::vector<const CLI::Option*> opts) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;

 private:
  size_t width_;
};

// `text` in lines of at most `width` characters, broken at spaces (a longer word gets a line of its own); a
// '\n' in it ends a line.
std::vector<std::string> wrap_words(const std::string& text, size_t width);

}  // namespace cz::train
