// Training commands: reading a flag's value from one and setting one (every earlier spelling, "--flag V" or
// "--flag=V", removed first), so that a restart changes only what it must; and the one command that resumes
// a stopped run, which convnext_zero prints and czrun prints for its own stops.
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

// Note [Resume command]: the command that continues a stopped run is the command that started it, launcher
// and launcher options included, with `--resume DIR` in place of any earlier --resume. `head` is what comes
// before the program's arguments: the launcher's words up to and including the program
// ({"mpirun", "--allow-run-as-root", "-np", "4", "build/apps/convnext_zero"}), or just the program; `args`
// is the program's argv (args[0] is replaced by head).
std::string resume_command(const std::vector<std::string>& head, const std::vector<std::string>& args,
                           const std::string& resume_flag, const std::string& dir);

// The launcher's words up to and including the program, when `launcher_argv` (the command line of this
// process's parent) ends with this process's arguments `args` (args[0] is the program): Open MPI's mpirun
// starts the ranks of its own host itself, with the arguments it was given. nullopt otherwise (a rank
// started by a remote orted, srun or hydra, whose command lines do not hold the user's).
std::optional<std::vector<std::string>> launcher_head(const std::vector<std::string>& launcher_argv,
                                                      const std::vector<std::string>& args);
// The command line of this process's parent (/proc/PPID/cmdline) when the parent is an MPI launcher (its
// executable named mpirun, mpiexec, orterun or prterun, as Debian's /usr/bin/mpirun -> orterun is); empty
// otherwise, or when it cannot be read. A wrapper between the launcher and the rank (bash -c ...) has the
// rank's arguments at the end of its command line too, but is not what the user typed to start the job.
std::vector<std::string> launcher_command_line();

}  // namespace cz::elastic
