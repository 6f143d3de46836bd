// Starting, watching and stopping the supervisor's child processes.
#include "dist/elastic/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "tensor/check.h"

namespace cz::elastic {
namespace {

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += size_t(n);
  }
}

}  // namespace

Child::Child(const std::vector<std::string>& argv, Output output) {
  CZ_CHECK(!argv.empty(), "Child: no command");
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (output == Output::kForward) {
    CZ_CHECK_IO(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0, "cannot make a pipe: {}",
                std::strerror(errno));
  }
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_ = ::fork();
  CZ_CHECK_IO(pid_ >= 0, "cannot start {}: fork: {}", argv[0], std::strerror(errno));
  if (pid_ == 0) {
    ::setpgid(0, 0);
    if (output == Output::kForward) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
    } else {
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
    }
    // The supervisor's stop handlers are not the child's.
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
    ::execvp(cargv[0], cargv.data());
    const std::string msg = "czrun: cannot run " + argv[0] + ": " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, msg);
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also here: no race with a signal to the group before the child ran setpgid
  if (output == Output::kForward) {
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
  }
}

Child::~Child() {
  if (!exited_ && pid_ > 0) {
    kill_group();
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (out_ >= 0) ::close(out_);
  if (err_ >= 0) ::close(err_);
}

void Child::signal(int sig) const {
  if (!exited_) ::kill(pid_, sig);
}

void Child::kill_group() const {
  ::kill(-pid_, SIGKILL);
}

void Child::read_fd(int& fd, std::string& pending, bool err,
                    const std::function<void(const std::string&)>& on_line) {
  char buf[8192];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // end of file: whatever is left is the last line
    if (!pending.empty()) {
      write_all(err ? STDERR_FILENO : STDOUT_FILENO, pending + "\n");
      if (on_line) on_line(pending);
      pending.clear();
    }
    ::close(fd);
    fd = -1;
    return;
  }
  pending.append(buf, size_t(n));
  size_t start = 0;
  for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string line = pending.substr(start, nl - start);
    write_all(err ? STDERR_FILENO : STDOUT_FILENO, line + "\n");
    if (on_line) on_line(line);
  }
  pending.erase(0, start);
}

bool Child::poll(int ms, const std::function<void(const std::string&)>& on_line) {
  if (!exited_) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }
  pollfd fds[2];
  int n = 0;
  if (out_ >= 0) fds[n++] = {out_, POLLIN, 0};
  if (err_ >= 0) fds[n++] = {err_, POLLIN, 0};
  if (n == 0) {
    if (!exited_) ::poll(nullptr, 0, ms);
    return exited_;
  }
  if (::poll(fds, nfds_t(n), exited_ ? 0 : ms) > 0) {
    for (int i = 0; i < n; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (fds[i].fd == out_)
        read_fd(out_, out_pending_, false, on_line);
      else
        read_fd(err_, err_pending_, true, on_line);
    }
  }
  return exited_;
}

void Child::finish(int ms, const std::function<void(const std::string&)>& on_line) {
  kill_group();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while ((out_ >= 0 || err_ >= 0) && std::chrono::steady_clock::now() < deadline) poll(20, on_line);
  for (int* fd : {&out_, &err_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

std::vector<bool> run_all(const std::vector<std::vector<std::string>>& commands, double timeout_s) {
  std::vector<std::unique_ptr<Child>> children;
  for (const auto& c : commands) children.push_back(std::make_unique<Child>(c, Child::Output::kDiscard));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    bool all = true;
    for (auto& c : children) all = c->poll(0) && all;
    if (all || std::chrono::steady_clock::now() >= deadline) break;
    ::poll(nullptr, 0, 20);
  }
  std::vector<bool> ok;
  for (auto& c : children) {
    ok.push_back(c->exited() && c->exit_code() == 0);
    if (c->exited()) c->kill_group();  // a daemon the probe left behind
  }
  return ok;  // the destructors kill and reap the rest
}

}  // namespace cz::elastic
