// Editing the relaunched command's flags.
#include "dist/elastic/command.h"

#include "tensor/check.h"

namespace cz::elastic {

std::optional<std::string> flag_value(const std::vector<std::string>& args, const std::string& flag) {
  std::optional<std::string> value;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == flag) {
      CZ_CHECK(i + 1 < args.size(), "the command ends with {} and no value", flag);
      value = args[++i];
    } else if (args[i].rfind(flag + "=", 0) == 0) {
      value = args[i].substr(flag.size() + 1);
    }
  }
  return value;
}

std::vector<std::string> with_flag(std::vector<std::string> args, const std::string& flag,
                                   const std::string& value) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0 && args[i] == flag) {
      ++i;
      continue;
    }
    if (i > 0 && args[i].rfind(flag + "=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  out.push_back(flag);
  out.push_back(value);
  return out;
}

std::string shell_words(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& w : args) {
    if (!out.empty()) out += ' ';
    if (!w.empty() &&
        w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=,+@%") ==
            std::string::npos) {
      out += w;
      continue;
    }
    out += '\'';
    for (char ch : w) {
      if (ch == '\'')
        out += "'\\''";
      else
        out += ch;
    }
    out += '\'';
  }
  return out;
}

}  // namespace cz::elastic
