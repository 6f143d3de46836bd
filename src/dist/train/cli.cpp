// The flag table on CLI11: registration by section, last-value-wins, and --help wrapped to the terminal.
#include "dist/train/cli.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "dist/train/flags.h"

namespace cz::train {
namespace {

// "2,2,6,2" as a list of integers; CLI11's error (exit code 2, naming the flag) for anything else.
std::vector<int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      throw CLI::ValidationError(flag, fmt::format("expected integers separated by commas, got '{}'", text));
    out.push_back(v);
  }
  return out;
}

void add_flag(CLI::App& app, const Flag& f, TrainConfig& c, const std::string& group) {
  std::visit(
      [&](auto member) {
        auto& value = c.*member;
        using V = std::decay_t<decltype(value)>;
        CLI::Option* o = nullptr;
        if constexpr (std::is_same_v<V, bool>) {
          o = f.inverted ? app.add_flag_callback(
                               f.name, [&value] { value = false; }, f.help)
                         : app.add_flag(f.name, value, f.help);
        } else if constexpr (std::is_same_v<V, std::vector<int64_t>>) {
          // One occurrence is the whole list, so that the last one given wins (CLI11 would otherwise
          // concatenate the occurrences of a vector option).
          const std::string name = f.name;
          o = app.add_option_function<std::string>(
                     f.name, [&value, name](const std::string& s) { value = parse_list(name, s); }, f.help)
                  ->type_name("LIST");
        } else {
          o = app.add_option(f.name, value, f.help);
          if (!std::is_same_v<V, std::string> || !flag_value(c, f).empty()) o->capture_default_str();
        }
        o->group(group);
      },
      f.field);
}

}  // namespace

void take_last_values(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void add_flags(CLI::App& app, TrainConfig& c) {
  for (const char* group : kFlagGroups)
    for (const Flag& f : flags())
      if (f.group && std::string(f.group) == group) add_flag(app, f, c, group);
  for (const Flag& f : flags())
    if (!f.group) add_flag(app, f, c, "Other options");
}

size_t help_width() {
  if (const char* columns = std::getenv("COLUMNS"); columns && std::atoi(columns) > 0)
    return size_t(std::atoi(columns));
  winsize ws{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

std::vector<std::string> wrap_words(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::stringstream paragraphs(text);
  for (std::string paragraph; std::getline(paragraphs, paragraph);) {
    std::string line;
    std::stringstream words(paragraph);
    for (std::string word; words >> word;) {
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        lines.push_back(line);
        line.clear();
      }
      // A word wider than a line ("atto|femto|...|xlarge") breaks after a '|' or ',' where it can.
      while (line.empty() && word.size() > width) {
        const size_t cut = word.find_last_of("|,", width - 1);
        if (cut == std::string::npos) break;
        lines.push_back(word.substr(0, cut + 1));
        word.erase(0, cut + 1);
      }
      line += (line.empty() ? "" : " ") + word;
    }
    lines.push_back(line);
  }
  return lines;
}

WrappingFormatter::WrappingFormatter(size_t width) : width_(std::max<size_t>(width, 40)) {
  column_width(std::min<size_t>(30, width_ / 3));
}

// "  --name TYPE [default]" in the left column, the description wrapped beside it; a name wider than the
// column puts the description on the lines below.
std::string WrappingFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
  const std::string name = "  " + make_option_name(opt, is_positional) + make_option_opts(opt);
  const size_t indent = get_column_width();
  std::string out = name;
  const std::vector<std::string> lines = wrap_words(make_option_desc(opt), width_ - indent);
  bool first = true;
  for (const std::string& line : lines) {
    if (first && name.size() < indent)
      out += std::string(indent - name.size(), ' ');
    else
      out += "\n" + std::string(indent, ' ');
    out += line;
    first = false;
  }
  return out + "\n";
}

std::string WrappingFormatter::make_description(const CLI::App* app) const {
  std::string out;
  for (const std::string& line : wrap_words(app->get_description(), width_)) out += line + "\n";
  return out;
}

std::string WrappingFormatter::make_group(std::string group, bool is_positional,
                                          std::vector<const CLI::Option*> opts) const {
  std::string out = group + ":\n";
  for (const CLI::Option* opt : opts) out += make_option(opt, is_positional);
  return out;
}

std::string WrappingFormatter::make_usage(const CLI::App* app, std::string name) const {
  return CLI::Formatter::make_usage(app, std::move(name)) + "\n";
}

std::string WrappingFormatter::make_footer(const CLI::App* app) const {
  if (app->get_footer().empty()) return "";
  std::string out = "\n";
  for (const std::string& line : wrap_words(app->get_footer(), width_)) out += line + "\n";
  return out;
}

}  // namespace cz::train
