// The caller's side of Note [Probing HDF5 files]: start cz_h5_probe with posix_spawn, collect its lines
// through a pipe under a deadline, and turn its death, its limits or its findings into an IoError.
#include "io/h5/h5_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <vector>

#include "io/h5/h5_probe_protocol.h"
#include "io/h5/helper_programs.h"
#include "tensor/check.h"

extern char** environ;

namespace cz::h5 {
namespace {

namespace protocol = probe_protocol;

// Its own file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// What the helper said, line by line.
struct Output {
  std::string pending;  // an unfinished last line
  std::string phase = "starting";
  std::string unsafe, memory, other;
  bool done = false;
  ProbeReport report;

  void add(const char* data, size_t n) {
    pending.append(data, n);
    for (size_t end = pending.find('\n'); end != std::string::npos; end = pending.find('\n')) {
      line(pending.substr(0, end));
      pending.erase(0, end + 1);
    }
    if (pending.size() > 4096) pending.erase(0, pending.size() - 4096);
  }
  void finish() {
    if (!pending.empty()) line(pending);
    pending.clear();
  }
  void line(const std::string& l) {
    if (starts_with(l, protocol::kAt)) {
      phase = l.substr(std::strlen(protocol::kAt));
    } else if (starts_with(l, protocol::kUnsafe)) {
      unsafe = l.substr(std::strlen(protocol::kUnsafe));
    } else if (starts_with(l, protocol::kMemory)) {
      memory = l.substr(std::strlen(protocol::kMemory));
    } else if (starts_with(l, protocol::kExternal)) {
      report.external_files.push_back(l.substr(std::strlen(protocol::kExternal)));
    } else if (starts_with(l, protocol::kSource)) {
      report.virtual_sources.push_back(l.substr(std::strlen(protocol::kSource)));
    } else if (starts_with(l, protocol::kDone)) {
      std::istringstream in(l.substr(std::strlen(protocol::kDone)));
      done =
          bool(in >> report.objects >> report.datasets >> report.sampled_bytes >> report.unsampled_datasets);
    } else if (!l.empty()) {
      other = l.substr(0, 300);  // the last stray line: a libc or sanitizer message about the crash
    }
  }
};

struct Child {
  pid_t pid = -1;
  int status = 0;
  bool reaped = false;
  bool timed_out = false;
};

// Reads the helper's output until it exits or the deadline passes (then kills it), and reaps it. The pipe's
// end of file alone is not enough: a process another thread forks meanwhile inherits the pipe's write end
// until it execs, so the helper's exit is also watched through a pidfd where the kernel has them.
void collect(Child& child, int out_fd, double seconds, Output& out) {
  const Fd pidfd(int(::syscall(SYS_pidfd_open, child.pid, 0)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  bool eof = false, exited = false;
  char buffer[4096];
  while (!eof && !exited) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      child.timed_out = true;
      ::kill(child.pid, SIGKILL);
      break;
    }
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {pidfd.get(), POLLIN, 0}};
    const int ready =
        ::poll(fds, pidfd.get() >= 0 ? 2 : 1, int(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno != EINTR) {
      ::kill(child.pid, SIGKILL);
      break;
    }
    if (ready <= 0) continue;
    if (fds[0].revents != 0) {
      const ssize_t n = ::read(out_fd, buffer, sizeof(buffer));
      if (n > 0) out.add(buffer, size_t(n));
      eof = n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
    }
    exited = pidfd.get() >= 0 && fds[1].revents != 0;
  }
  if (exited) {  // what it wrote before exiting is still in the pipe
    ::fcntl(out_fd, F_SETFL, ::fcntl(out_fd, F_GETFL) | O_NONBLOCK);
    for (ssize_t n; (n = ::read(out_fd, buffer, sizeof(buffer))) > 0;) out.add(buffer, size_t(n));
  }
  out.finish();
  pid_t got;
  while ((got = ::waitpid(child.pid, &child.status, 0)) < 0 && errno == EINTR) {
  }
  // ECHILD: the program ignores SIGCHLD, so the kernel reaped the helper; then only its "done" line counts.
  child.reaped = got == child.pid;
}

Child spawn(const std::string& helper, const std::vector<std::string>& args, int out_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attr);
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  ::posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
  // Not the caller's HDF5 files, sockets or pipes: a helper outliving a dying caller must not hold them.
  ::posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  // Default handlers, whatever the calling thread has: a crash must end the helper. The stop signals are
  // blocked until the helper ignores them (Note [Stop signals and the probe] in h5_probe_child.cpp).
  sigset_t stops, all;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&stops, sig);
  sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attr, &stops);
  ::posix_spawnattr_setsigdefault(&attr, &all);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(helper.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child child;
  const int err = ::posix_spawn(&child.pid, helper.c_str(), &actions, &attr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (err != 0) child.pid = -err;
  return child;
}

std::string mib(int64_t bytes) {
  return bytes % (int64_t{1} << 30) == 0 ? fmt::format("{} GiB", bytes >> 30)
                                         : fmt::format("{} MiB", bytes >> 20);
}

// One file, without following its external links.
ProbeReport probe_one(const std::string& path, const std::string& name, const ProbeLimits& limits) {
  // Note [Helpers beside the program]: the probe is looked for at each file, which costs a few stat calls
  // next to the ~8 ms of starting it.
  std::string helper = limits.helper;
  if (helper.empty()) {
    try {
      helper = find_helper("cz_h5_probe", "the HDF5 probe");
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}: cannot check the file: {}", name, e.what()));
    }
  }
  int fds[2];
  CZ_CHECK_IO(::pipe2(fds, O_CLOEXEC) == 0, "{}: cannot check the file: pipe: {}", name,
              std::strerror(errno));
  Fd read_end(fds[0]), write_end(fds[1]);
  Child child = spawn(helper,
                      {path, std::to_string(limits.memory_bytes), std::to_string(limits.sample_bytes),
                       std::to_string(int64_t(std::ceil(limits.seconds)))},
                      write_end.get());
  CZ_CHECK_IO(child.pid > 0, "{}: cannot check the file: cannot start the HDF5 probe {}: {}", name, helper,
              std::strerror(-child.pid));
  write_end.reset();
  Output out;
  collect(child, read_end.get(), limits.seconds, out);

  const std::string detail = out.other.empty() ? "" : ": " + out.other;
  if (child.timed_out)
    throw IoError(fmt::format(
        "{}: libhdf5 did not finish reading the file within {} s (it was {}): the file is corrupt, or its "
        "file system is not responding",
        name, limits.seconds, out.phase));
  if (child.reaped && WIFSIGNALED(child.status)) {
    const int sig = WTERMSIG(child.status);
    const bool crash = sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGABRT ||
                       sig == SIGTRAP || sig == SIGSYS;
    throw IoError(fmt::format("{}: {} ({}{}) while {}: the file is corrupt or not HDF5", name,
                              crash ? "libhdf5 crashed" : "the process reading it with libhdf5 was killed",
                              signal_name(sig), detail, out.phase));
  }
  const int code = child.reaped && WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1;
  if (code == protocol::kExitUnsafe)
    throw IoError(
        fmt::format("{}: {}: the file is corrupt (libhdf5 would read past its buffers)", name, out.unsafe));
  if (code == protocol::kExitMemory)
    throw IoError(fmt::format("{}: libhdf5 needed more than {} of memory while {}: the file is corrupt", name,
                              mib(limits.memory_bytes), out.memory));
  if ((code == protocol::kExitWalked || (code == -1 && !child.reaped)) && out.done) return out.report;
  throw IoError(fmt::format(
      "{}: cannot check the file: the HDF5 probe {} ended with {}{}", name, helper,
      code >= 0 ? fmt::format("exit status {}", code) : std::string("an unknown status"), detail));
}

}  // namespace

ProbeReport probe_file(const std::string& path, const std::string& name, const ProbeLimits& limits) {
  const ProbeReport report = probe_one(path, name, limits);
  // External links, resolved as HDF5 first tries them (relative to the linking file's folder), each file
  // once, so that links in a cycle end.
  std::error_code ec;
  std::set<std::filesystem::path> seen = {std::filesystem::weakly_canonical(path, ec)};
  std::vector<std::pair<std::filesystem::path, std::vector<std::string>>> pending = {
      {std::filesystem::path(path).parent_path(), report.external_files}};
  while (!pending.empty()) {
    auto [folder, files] = std::move(pending.back());
    pending.pop_back();
    for (const std::string& f : files) {
      const std::filesystem::path p =
          std::filesystem::path(f).is_absolute() ? std::filesystem::path(f) : folder / f;
      if (!std::filesystem::is_regular_file(p, ec) ||
          !seen.insert(std::filesystem::weakly_canonical(p, ec)).second)
        continue;
      const ProbeReport linked =
          probe_one(p.string(), fmt::format("{} (external link from {})", p.string(), name), limits);
      pending.emplace_back(p.parent_path(), linked.external_files);
    }
  }
  return report;
}

}  // namespace cz::h5
