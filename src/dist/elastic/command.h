// The training command the supervisor relaunches: reading a flag's value from it and setting one (every
// earlier spelling, "--flag V" or "--flag=V", removed first), so that a restart changes only what it must.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace cz::elastic {

// The value of the last occurrence of `flag` in `args` (args[0] is the program), nullopt when absent.
// ValueError when the flag is last with no value.
std::optional<std::string> flag_value(const std::vector<std::string>& args, const std::string& flag);
// `args` without any occurrence of `flag` (and its value), then "flag value" appended.
std::vector<std::string> with_flag(std::vector<std::string> args, const std::string& flag,
                                   const std::string& value);
// The words joined for a log line, each quoted as a POSIX shell would need.
std::string shell_words(const std::vector<std::string>& args);

}  // namespace cz::elastic
