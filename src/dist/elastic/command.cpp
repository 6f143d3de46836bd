// Editing the relaunched command's flags, and the resume command (Note [Resume command]).
#include "dist/elastic/command.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

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

std::string resume_command(const std::vector<std::string>& head, const std::vector<std::string>& args,
                           const std::string& resume_flag, const std::string& dir) {
  CZ_CHECK(!head.empty() && !args.empty(), "resume_command: no program");
  std::vector<std::string> words = head;
  const std::vector<std::string> rest = with_flag(args, resume_flag, dir);
  words.insert(words.end(), rest.begin() + 1, rest.end());
  return shell_words(words);
}

std::optional<std::vector<std::string>> launcher_head(const std::vector<std::string>& launcher_argv,
                                                      const std::vector<std::string>& args) {
  if (args.empty() || launcher_argv.size() <= args.size()) return std::nullopt;
  const size_t program = launcher_argv.size() - args.size();
  for (size_t i = 1; i < args.size(); ++i)
    if (launcher_argv[program + i] != args[i]) return std::nullopt;
  return std::vector<std::string>(launcher_argv.begin(), launcher_argv.begin() + std::ptrdiff_t(program) + 1);
}

std::vector<std::string> launcher_command_line() {
  const std::string proc = "/proc/" + std::to_string(::getppid());
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink(proc + "/exe", ec).filename().string();
  bool launcher = false;
  for (const char* name : {"mpirun", "mpiexec", "orterun", "prterun"})
    launcher = launcher || exe.starts_with(name);
  if (ec || !launcher) return {};
  std::ifstream f(proc + "/cmdline", std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t i = 0; i < raw.size(); ++i)
    if (raw[i] == '\0') {
      words.push_back(raw.substr(start, i - start));
      start = i + 1;
    }
  return words;
}

}  // namespace cz::elastic
