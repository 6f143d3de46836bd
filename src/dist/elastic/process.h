// Child processes for the supervisor: mpirun in a process group of its own whose output is copied through
// line by line (so the supervisor can see the ranks' failure messages), signals to it or its whole group,
// and bounded waits. POSIX only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace cz::elastic {

class Child {
 public:
  enum class Output { kForward, kDiscard };
  // Starts argv[0] (searched in PATH) with `argv`, as the leader of a new process group. kForward: its
  // stdout and stderr come through pipes and poll() copies them to ours; kDiscard: /dev/null.
  Child(const std::vector<std::string>& argv, Output output);
  ~Child();  // kills the group if the child still runs, reaps it
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // Waits up to `ms` for output or exit; copies each complete line through and hands it to `on_line`.
  // Returns true once the child has exited (and been reaped).
  bool poll(int ms, const std::function<void(const std::string& line)>& on_line = {});
  bool exited() const { return exited_; }
  // The exit status as a shell shows it: the code, or 128 + the signal.
  int exit_code() const { return exit_code_; }
  pid_t pid() const { return pid_; }
  void signal(int sig) const;  // to the child alone
  void kill_group() const;     // SIGKILL to every process left in its group
  // After exit: kills what is left of the group and copies what is left in the pipes (at most `ms`).
  void finish(int ms, const std::function<void(const std::string& line)>& on_line = {});

 private:
  void read_fd(int& fd, std::string& pending, bool err,
               const std::function<void(const std::string&)>& on_line);
  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  std::string out_pending_, err_pending_;
  bool exited_ = false;
  int exit_code_ = -1;
};

// Runs each command (kDiscard) at once and waits at most `timeout_s`: true for those that exited 0 in time.
// The ones still running then are killed with their groups.
std::vector<bool> run_all(const std::vector<std::vector<std::string>>& commands, double timeout_s);

}  // namespace cz::elastic
