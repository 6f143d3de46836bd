// The elastic supervisor's loop (Note [Elastic restarts] in supervisor.h).
#include "dist/elastic/supervisor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>

#include "dist/elastic/command.h"
#include "dist/elastic/hostfile.h"
#include "dist/elastic/process.h"
#include "dist/elastic/resize.h"
#include "dist/elastic/run_log.h"
#include "dist/train/config.h"
#include "dist/train/flags.h"
#include "io/checkpoint/checkpoint_layout.h"
#include "tensor/check.h"

namespace cz::elastic {
namespace {

using train::flag_name, train::TrainConfig;

volatile sig_atomic_t g_stop_requests = 0;
volatile sig_atomic_t g_stop_signal = 0;
void on_stop(int sig) {
  if (g_stop_signal == 0) g_stop_signal = sig;
  g_stop_requests = g_stop_requests + 1;
}

// One of three SIGTERM handlers: Note [Three SIGTERM handlers] in src/dist/train/stop.cpp.
void install_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

void say(const std::string& text) {
  std::fflush(stdout);
  std::fprintf(stderr, "czrun: %s\n", text.c_str());
  std::fflush(stderr);
}

int64_t int_flag(const std::vector<std::string>& cmd, const char* flag, int64_t otherwise) {
  const auto v = flag_value(cmd, flag);
  if (!v) return otherwise;
  try {
    size_t used = 0;
    const int64_t n = std::stoll(*v, &used);
    if (used == v->size()) return n;
  } catch (const std::exception&) {
  }
  throw ValueError(fmt::format("the command's {} must be a whole number, got '{}'", flag, *v));
}

// The newest published checkpoint of `dir`: the one `latest` names, else the highest step_N; nullopt if none.
std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir) {
  const auto all = ckpt::detail::list_checkpoints(dir);
  if (const auto latest = ckpt::detail::read_latest(dir)) {
    for (const auto& c : all)
      if (ckpt::detail::step_dir_name(c.first) == *latest) return c;
  }
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::vector<std::string> names_of(const std::vector<Host>& hosts) {
  std::vector<std::string> out;
  for (const Host& h : hosts) out.push_back(h.name);
  return out;
}

std::vector<int> ranks_on(const std::vector<Host>& used, const std::set<std::string>& lost) {
  std::vector<int> out;
  for (const Placement& p : place_ranks(used))
    if (lost.count(p.host.name))
      for (int r = 0; r < p.host.slots; ++r) out.push_back(p.first_rank + r);
  return out;
}

// One mpirun of the job, watched (Note [Elastic restarts]).
struct Attempt {
  int exit_code = -1;
  bool stopped = false;          // the supervisor forwarded a stop request
  bool failure_seen = false;     // a rank aborted or mpirun lost a daemon
  bool killed = false;           // mpirun outlived --teardown-grace and was killed
  bool start_timed_out = false;  // no step within --start-timeout: killed
  double t_launch = 0, t_first_step = 0, t_last_growth = 0, t_failure = 0, t_exit = 0;
  double load_s = -1;  // the trainer's "resumed from ... in X s"
};

Attempt run_attempt(const std::vector<std::string>& argv, const std::string& log,
                    const SupervisorOptions& o) {
  Attempt a;
  a.t_launch = unix_time();
  Child mpirun(argv, Child::Output::kForward);
  int stops_forwarded = 0;
  off_t log_size = 0;
  double deadline = 0;
  auto on_line = [&](const std::string& line) {
    if (!a.failure_seen && is_failure_line(line)) {
      a.failure_seen = true;
      a.t_failure = unix_time();
      deadline = a.t_failure + o.teardown_grace_s;
    }
    if (const size_t at = line.find("resumed from "); at != std::string::npos) {
      if (const size_t in = line.rfind(" in "); in != std::string::npos && line.ends_with(" s"))
        a.load_s = std::atof(line.c_str() + in + 4);
    }
  };
  while (!mpirun.poll(100, on_line)) {
    struct stat st {};
    if (::stat(log.c_str(), &st) == 0 && st.st_size > log_size) {
      log_size = st.st_size;
      a.t_last_growth = unix_time();
      if (a.t_first_step == 0) a.t_first_step = a.t_last_growth;
    }
    const int requests = g_stop_requests;
    if (requests > stops_forwarded) {
      if (stops_forwarded == 0) {
        // mpirun passes SIGUSR1 on to every rank and waits for them without a deadline (Note [Stopping on
        // request]); a SIGTERM would have mpirun kill them a second later.
        say(
            fmt::format("{}: asking the job to stop after this step and save a checkpoint (send it again to "
                        "kill it)",
                        g_stop_signal == SIGINT    ? "SIGINT"
                        : g_stop_signal == SIGUSR1 ? "SIGUSR1"
                                                   : "SIGTERM"));
        mpirun.signal(SIGUSR1);
        a.stopped = true;
      } else {
        say("second stop request: killing the job");
        mpirun.kill_group();
      }
      stops_forwarded = requests;
    }
    // A daemon that cannot call back (its host's link went down as the launch began) is never reported:
    // the rsh agent returned once the daemon had put itself in the background, and Open MPI's
    // orte_startup_timeout did not end such a launch (60 s and counting).
    if (a.t_first_step == 0 && o.start_timeout_s > 0 && unix_time() > a.t_launch + o.start_timeout_s &&
        !a.killed && !a.stopped) {
      say(fmt::format("no step {:.0f} s after the launch (--start-timeout): killing mpirun and its agents",
                      o.start_timeout_s));
      mpirun.kill_group();
      a.killed = true;
      a.start_timed_out = true;
      a.failure_seen = true;
      a.t_failure = unix_time();
    }
    if (deadline > 0 && unix_time() > deadline && !a.killed) {
      say(fmt::format("mpirun has not exited {:.0f} s after the failure: killing it and its agents",
                      o.teardown_grace_s));
      mpirun.kill_group();
      a.killed = true;
    }
  }
  a.t_exit = unix_time();
  mpirun.finish(2000, on_line);
  a.exit_code = mpirun.exit_code();
  return a;
}

// Open MPI's oob TCP keepalive for a daemon that stops answering: idle time, then probes one interval apart,
// time + probes x interval = daemon_timeout_s.
std::vector<std::string> keepalive_options(int seconds) {
  if (seconds <= 0) return {};
  const int idle = std::max(1, seconds / 2), probes = std::max(1, seconds - idle);
  return {"--mca", "oob_tcp_keepalive_time",   std::to_string(idle),  "--mca", "oob_tcp_keepalive_intvl", "1",
          "--mca", "oob_tcp_keepalive_probes", std::to_string(probes)};
}

// Note [Resume command]: czrun's own words, then the command with --resume CHECKPOINT_DIR (its newest).
void say_resume_command(const SupervisorOptions& o, const std::string& ck_dir, bool saved) {
  if (o.self.empty() || !saved) return;
  std::vector<std::string> head = o.self;
  head.push_back(o.command.front());
  say("resume with: " + resume_command(head, o.command, flag_name(&TrainConfig::resume), ck_dir));
}

// An attempt's launch: the launcher (o.mpirun: mpirun, or srun inside a Slurm job) over the hosts in use,
// `world` ranks, then the training command `run`.
std::vector<std::string> launch_command(const SupervisorOptions& o, const std::vector<Host>& used,
                                        const std::string& hostfile, int world,
                                        const std::vector<std::string>& run) {
  std::vector<std::string> argv = o.mpirun;
  if (o.srun) {
    // Note [czrun with srun]: inside a Slurm job an attempt may be an srun step over the nodes in use, in
    // order, block-distributed (each node's tasks before the next node's, as mpirun fills a hostfile's
    // slots), PMIx for MPI; --kill-on-bad-exit ends the step at a rank's abort, as mpirun ends its job. A
    // node is probed with a one-task step: srun fails at once on a node whose slurmd is gone. The ranks
    // learn of the supervisor from the environment, which srun passes on (mpirun needs -x).
    for (const std::string& w :
         {std::string("--mpi=pmix"), std::string("--kill-on-bad-exit=1"), std::string("--distribution=block"),
          fmt::format("--nodes={}", used.size()), fmt::format("--ntasks={}", world),
          fmt::format("--nodelist={}", fmt::join(names_of(used), ","))})
      argv.push_back(w);
  } else {
    for (const std::string& w : keepalive_options(o.daemon_timeout_s)) argv.push_back(w);
    // The ranks learn that a supervisor stops them (by SIGUSR1, Note [Elastic restarts]), so that they do
    // not advise a user to signal mpirun (convnext_zero's note on Open MPI's kill deadline).
    for (const char* w : {"-x", "CZ_SUPERVISOR=czrun"}) argv.emplace_back(w);
    for (const std::string& w :
         {std::string("--hostfile"), hostfile, std::string("-np"), std::to_string(world)})
      argv.push_back(w);
  }
  argv.insert(argv.end(), run.begin(), run.end());
  return argv;
}

// Whether host `h` still answers: one task of `true` on it, by the same launcher.
std::vector<std::string> probe_command(const SupervisorOptions& o, const Host& h) {
  std::vector<std::string> p = o.mpirun;
  if (o.srun) {
    for (const std::string& w :
         {std::string("--nodes=1"), std::string("--ntasks=1"), "--nodelist=" + h.name, std::string("true")})
      p.push_back(w);
  } else {
    for (const std::string& w : keepalive_options(o.daemon_timeout_s)) p.push_back(w);
    for (const std::string& w :
         {std::string("--host"), h.name, std::string("-np"), std::string("1"), std::string("true")})
      p.push_back(w);
  }
  return p;
}

}  // namespace

bool is_failure_line(const std::string& line) {
  return line.ends_with("; aborting") || line.find("ORTE has lost communication") != std::string::npos ||
         line.find("exited on signal") != std::string::npos;
}

namespace {

// The training command's flags the supervisor reads or rewrites.
struct CommandFlags {
  const char* checkpoint_dir = flag_name(&TrainConfig::checkpoint_dir);
  const char* checkpoint_every = flag_name(&TrainConfig::checkpoint_every);
  const char* micro_batch = flag_name(&TrainConfig::micro_batch);
  const char* grad_accum = flag_name(&TrainConfig::grad_accum);
  const char* log = flag_name(&TrainConfig::log);
  const char* resume = flag_name(&TrainConfig::resume);
};

// What a supervised run starts from: the hosts, the command's checkpoint folder and batch shape, and the
// folder of the attempts' logs and hostfiles.
struct RunStart {
  std::vector<Host> all_hosts;
  std::string ck_dir, work;
  BatchShape first;
};

// Reads and checks the options and the command before anything is written, then makes the work folder.
RunStart prepare_run(const SupervisorOptions& o, const CommandFlags& f) {
  RunStart r;
  r.all_hosts = o.hostfile.empty() ? o.hosts : read_hostfile(o.hostfile);
  CZ_CHECK(!r.all_hosts.empty(), "no hosts to run on");
  CZ_CHECK(!o.command.empty(), "no training command (give it after --)");
  const std::vector<std::string>& cmd = o.command;
  const auto ck_dir = flag_value(cmd, f.checkpoint_dir);
  CZ_CHECK(ck_dir && !ck_dir->empty(),
           "the command needs {} DIR: a restart resumes from its newest checkpoint", f.checkpoint_dir);
  r.ck_dir = *ck_dir;
  const TrainConfig defaults;
  const int64_t every = int_flag(cmd, f.checkpoint_every, defaults.checkpoint_every);
  r.first = {total_slots(r.all_hosts), int_flag(cmd, f.micro_batch, defaults.micro_batch),
             int_flag(cmd, f.grad_accum, defaults.grad_accum)};
  CZ_CHECK(r.first.micro_batch > 0 && r.first.grad_accum > 0, "the command's {} and {} must be positive",
           f.micro_batch, f.grad_accum);
  CZ_CHECK(o.min_ranks >= 1 && o.min_ranks <= r.first.world,
           "--min-ranks {} must be between 1 and the hostfile's {} slots", o.min_ranks, r.first.world);
  CZ_CHECK(o.max_restarts >= 0, "--max-restarts must be at least 0, got {}", o.max_restarts);
  if (every <= 0)
    say(
        fmt::format("warning: the command has no {} N: a restart goes back to the last checkpoint of an "
                    "earlier run, or to step 0",
                    f.checkpoint_every));
  r.work = o.work_dir.empty() ? r.ck_dir + "/czrun" : o.work_dir;
  ckpt::detail::make_dirs(r.work);
  return r;
}

// The hosts that answered the probes after a failure.
struct Probed {
  std::vector<Host> next;            // the hosts the next attempt may use
  std::set<std::string> lost, back;  // active hosts that did not answer; dropped ones that did (--readmit)
  double probe_s = 0;                // how long the probes took
};

// One supervised run (Note [Elastic restarts]): attempt after attempt, and what carries from one to the next.
class Supervision {
 public:
  explicit Supervision(const SupervisorOptions& o);
  int run();

 private:
  void event(nlohmann::json e) const {
    e["t"] = unix_time();
    log_.append(e);
    events_.append(e);
  }
  std::optional<std::pair<int64_t, std::string>> newest() const { return newest_checkpoint(start_.ck_dir); }
  std::vector<std::string> attempt_command(int attempt, const BatchShape& shape,
                                           const std::string& log) const;
  int stopped_between_attempts();
  void finish_pending_restart(const Attempt& a);
  int finished(const Attempt& a, const std::vector<nlohmann::json>& records, int64_t reached,
               const BatchShape& shape, const std::vector<Host>& used);
  Probed probe_hosts() const;
  std::optional<int> after_failure(const Attempt& a, const std::vector<nlohmann::json>& records,
                                   int64_t reached, const BatchShape& shape, const std::vector<Host>& used);

  const SupervisorOptions& o_;
  const CommandFlags flags_{};
  const RunStart start_;
  const EventLog log_;     // the command's --log: the attempts' step records, each step once, and the events
  const EventLog events_;  // the events alone, in the work folder
  std::vector<Host> active_;
  std::optional<std::string> resume_;
  int64_t resumed_step_ = 0;
  int restarts_ = 0;
  int64_t steps_lost_total_ = 0;
  std::vector<nlohmann::json> failures_;
  nlohmann::json pending_restart_;  // the failure event, finished with the next attempt's timings
};

Supervision::Supervision(const SupervisorOptions& o)
    : o_(o),
      start_(prepare_run(o, flags_)),
      log_(flag_value(o.command, flags_.log).value_or(""), /*truncate=*/true),
      events_(start_.work + "/events.jsonl", /*truncate=*/true),
      active_(start_.all_hosts),
      resume_(flag_value(o.command, flags_.resume)) {
  install_handlers();
  // srun passes its environment on: the ranks learn that a supervisor stops them (as mpirun's -x tells them).
  if (o.srun) ::setenv("CZ_SUPERVISOR", "czrun", 1);
}

int Supervision::run() {
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0 && g_stop_requests > 0) return stopped_between_attempts();
    const std::optional<BatchShape> shape = resize(start_.first, total_slots(active_), o_.min_ranks);
    if (!shape) {
      const std::string why = fmt::format(
          "giving up: the {} slots left ({}) hold no world size from --min-ranks {} up that divides the "
          "global "
          "batch {}",
          total_slots(active_), fmt::join(names_of(active_), ", "), o_.min_ranks,
          start_.first.global_batch());
      say(why);
      event({{"event", "give_up"}, {"reason", why}});
      return 1;
    }
    const std::vector<Host> used = take_slots(active_, shape->world);
    const std::string hostfile = fmt::format("{}/hostfile-{}", start_.work, attempt);
    const std::string attempt_log = fmt::format("{}/attempt-{}.jsonl", start_.work, attempt);
    write_hostfile(hostfile, used);
    std::remove(attempt_log.c_str());
    const std::vector<std::string> argv =
        launch_command(o_, used, hostfile, shape->world, attempt_command(attempt, *shape, attempt_log));
    if (attempt > 0) say(fmt::format("relaunching: {}", shell_words(argv)));
    event({{"event", "launch"},
           {"attempt", attempt},
           {"world", shape->world},
           {"hosts", names_of(used)},
           {"micro_batch", shape->micro_batch},
           {"grad_accum", shape->grad_accum},
           {"global_batch", shape->global_batch()},
           {"resume", resume_.value_or("")}});
    const Attempt a = run_attempt(argv, attempt_log, o_);
    const std::vector<nlohmann::json> records = read_records(attempt_log);
    const int64_t reached = last_step(records, resumed_step_);
    finish_pending_restart(a);
    if (a.stopped || a.exit_code == 0) return finished(a, records, reached, *shape, used);
    if (const std::optional<int> code = after_failure(a, records, reached, *shape, used)) return *code;
  }
}

// The training command of attempt `attempt`: its own log; after a failure, the new shape and the checkpoint.
std::vector<std::string> Supervision::attempt_command(int attempt, const BatchShape& shape,
                                                      const std::string& log) const {
  std::vector<std::string> run = with_flag(o_.command, flags_.log, log);
  if (attempt > 0) {
    run = with_flag(run, flags_.micro_batch, std::to_string(shape.micro_batch));
    run = with_flag(run, flags_.grad_accum, std::to_string(shape.grad_accum));
    if (resume_) run = with_flag(run, flags_.resume, *resume_);
  }
  return run;
}

// Asked to stop between attempts (while probing): no relaunch; what is published stays resumable.
int Supervision::stopped_between_attempts() {
  const auto ck = newest();
  const std::string why = fmt::format("stopped on request before restart {}; resume from {}", restarts_,
                                      ck ? ck->second : std::string("nothing (no checkpoint)"));
  say(why);
  say_resume_command(o_, start_.ck_dir, ck.has_value());
  if (!pending_restart_.is_null()) {
    event(pending_restart_);
    failures_.push_back(pending_restart_);
  }
  event({{"event", "summary"},
         {"failures", failures_},
         {"status", "stopped"},
         {"steps", resumed_step_},
         {"restarts", restarts_ - 1},
         {"steps_lost", steps_lost_total_},
         {"reason", why}});
  return 75;
}

// The previous failure's timings, now that attempt `a` has (or has not) taken a step.
void Supervision::finish_pending_restart(const Attempt& a) {
  if (pending_restart_.is_null()) return;
  auto& p = pending_restart_;
  p["relaunch_and_load_s"] = a.t_first_step > 0 ? a.t_first_step - a.t_launch : -1.0;
  p["checkpoint_load_s"] = a.load_s;
  p["failure_to_first_step_s"] = a.t_first_step > 0 ? a.t_first_step - p["t_last_step"].get<double>() : -1.0;
  event(p);
  failures_.push_back(p);
  pending_restart_ = nullptr;
}

// The job ended by itself or stopped on request: its records, the summary, and the exit code.
int Supervision::finished(const Attempt& a, const std::vector<nlohmann::json>& records, int64_t reached,
                          const BatchShape& shape, const std::vector<Host>& used) {
  log_.append_records(records, -1);
  const int code = a.stopped ? 75 : 0;
  nlohmann::json s = {{"event", "summary"},
                      {"status", a.stopped ? "stopped" : "done"},
                      {"steps", reached},
                      {"restarts", restarts_},
                      {"world", shape.world},
                      {"hosts", names_of(used)},
                      {"steps_lost", steps_lost_total_},
                      {"failures", failures_}};
  event(s);
  say(fmt::format("{} at step {} on {} rank{} after {} restart(s), {} step(s) lost in all{}",
                  a.stopped ? "stopped on request" : "done", reached, shape.world,
                  shape.world == 1 ? "" : "s", restarts_, steps_lost_total_,
                  a.stopped
                      ? fmt::format("; resume from {}",
                                    newest() ? newest()->second : std::string("nothing (no checkpoint)"))
                      : ""));
  if (a.stopped) say_resume_command(o_, start_.ck_dir, newest().has_value());
  return code;
}

// After a failure: which hosts still answer (every host with --readmit, else the active ones)?
Probed Supervision::probe_hosts() const {
  const double t_probe = unix_time();
  const std::vector<Host> candidates = o_.readmit ? start_.all_hosts : active_;
  std::vector<std::vector<std::string>> probes;
  for (const Host& h : candidates) probes.push_back(probe_command(o_, h));
  const std::vector<bool> answers = run_all(probes, o_.probe_timeout_s);
  Probed p;
  p.probe_s = unix_time() - t_probe;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const bool was_active = std::any_of(active_.begin(), active_.end(),
                                        [&](const Host& h) { return h.name == candidates[i].name; });
    if (answers[i]) {
      p.next.push_back(candidates[i]);
      if (!was_active) p.back.insert(candidates[i].name);
    } else if (was_active) {
      p.lost.insert(candidates[i].name);
    }
  }
  return p;
}

// A failed attempt: the exit code when the supervisor gives up, else nullopt with the next attempt set up
// (the hosts that answer, the checkpoint to resume from, the restart event pending its timings).
std::optional<int> Supervision::after_failure(const Attempt& a, const std::vector<nlohmann::json>& records,
                                              int64_t reached, const BatchShape& shape,
                                              const std::vector<Host>& used) {
  const Probed probed = probe_hosts();
  const std::set<std::string>& lost = probed.lost;
  if (reached == resumed_step_ && records.empty() && !a.failure_seen && lost.empty()) {
    const std::string why = fmt::format(
        "giving up: the job failed before its first step (mpirun exit {}) with every host answering, which "
        "is not a lost host; see its output above",
        a.exit_code);
    say(why);
    event({{"event", "give_up"}, {"reason", why}, {"exit_code", a.exit_code}});
    return 1;
  }
  ckpt::detail::remove_leftovers(
      start_.ck_dir);  // half-written checkpoints: never resumed from, now not seen
  const auto ck = newest();
  const int64_t from = ck ? ck->first : 0;
  // Records past the checkpoint are redone by the next attempt; the log keeps each step once.
  log_.append_records(records, from);
  const int64_t lost_steps = std::max<int64_t>(0, reached - from);
  const std::vector<int> lost_ranks = ranks_on(used, lost);
  ++restarts_;
  const std::string where =
      lost.empty()
          ? (a.start_timed_out ? fmt::format("no step within --start-timeout {:.0f} s, every host answers",
                                             o_.start_timeout_s)
                               : fmt::format("every host answers (mpirun exit {})", a.exit_code))
          : fmt::format("lost host{} {} (ranks [{}] of {}) did not answer within {:.0f} s",
                        lost.size() > 1 ? "s" : "", fmt::join(lost, ", "), fmt::join(lost_ranks, ", "),
                        shape.world, o_.probe_timeout_s);
  const std::string ck_text = ck ? fmt::format("the newest published checkpoint is {} ({} step{} lost)",
                                               ck->second, lost_steps, lost_steps == 1 ? "" : "s")
                                 : fmt::format("no checkpoint was published ({} steps lost)", lost_steps);
  const double t_last_step = a.t_last_growth > 0 ? a.t_last_growth : a.t_launch;
  nlohmann::json f = {{"event", "restart"},
                      {"restart", restarts_},
                      {"failed_at_step", reached},
                      {"exit_code", a.exit_code},
                      {"lost_hosts", std::vector<std::string>(lost.begin(), lost.end())},
                      {"lost_ranks", lost_ranks},
                      {"readmitted_hosts", std::vector<std::string>(probed.back.begin(), probed.back.end())},
                      {"old_world", shape.world},
                      {"checkpoint", ck ? ck->second : ""},
                      {"resume_step", from},
                      {"steps_lost", lost_steps},
                      {"t_last_step", t_last_step},
                      {"detection_s", (a.failure_seen ? a.t_failure : a.t_exit) - t_last_step},
                      {"teardown_s", a.failure_seen ? a.t_exit - a.t_failure : 0.0},
                      {"mpirun_killed", a.killed},
                      {"start_timeout", a.start_timed_out},
                      {"probe_s", probed.probe_s}};
  if (restarts_ > o_.max_restarts) {
    const std::string why = fmt::format(
        "the job failed at step {}: {}; {}; giving up after {} restart(s) "
        "(--max-restarts {})",
        reached, where, ck_text, restarts_ - 1, o_.max_restarts);
    say(why);
    f["event"] = "give_up";
    f["reason"] = why;
    event(f);
    return 1;
  }
  const std::optional<BatchShape> next_shape = resize(start_.first, total_slots(probed.next), o_.min_ranks);
  say(fmt::format(
      "the job failed at step {}: {}; {}; restart {} of {}{}{}", reached, where, ck_text, restarts_,
      o_.max_restarts, next_shape ? fmt::format(" at {}", describe(*next_shape)) : std::string(),
      probed.back.empty() ? std::string() : fmt::format(" (re-admitted: {})", fmt::join(probed.back, ", "))));
  if (next_shape)
    f["new_world"] = next_shape->world, f["micro_batch"] = next_shape->micro_batch,
    f["grad_accum"] = next_shape->grad_accum;
  steps_lost_total_ += lost_steps;
  pending_restart_ = f;
  active_ = probed.next;
  resume_ = ck ? std::optional<std::string>(ck->second) : std::nullopt;
  resumed_step_ = from;
  return std::nullopt;
}

}  // namespace

int supervise(const SupervisorOptions& o) {
  return Supervision(o).run();
}

}  // namespace cz::elastic
