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

int supervise(const SupervisorOptions& o) {
  const std::vector<Host> all_hosts = o.hostfile.empty() ? o.hosts : read_hostfile(o.hostfile);
  CZ_CHECK(!all_hosts.empty(), "no hosts to run on");
  CZ_CHECK(!o.command.empty(), "no training command (give it after --)");
  const std::vector<std::string>& cmd = o.command;
  const char *ck_flag = flag_name(&TrainConfig::checkpoint_dir),
             *every_flag = flag_name(&TrainConfig::checkpoint_every),
             *mb_flag = flag_name(&TrainConfig::micro_batch), *ga_flag = flag_name(&TrainConfig::grad_accum),
             *log_flag = flag_name(&TrainConfig::log), *resume_flag = flag_name(&TrainConfig::resume);
  const auto ck_dir = flag_value(cmd, ck_flag);
  CZ_CHECK(ck_dir && !ck_dir->empty(),
           "the command needs {} DIR: a restart resumes from its newest checkpoint", ck_flag);
  const TrainConfig defaults;
  const int64_t every = int_flag(cmd, every_flag, defaults.checkpoint_every);
  const BatchShape first{total_slots(all_hosts), int_flag(cmd, mb_flag, defaults.micro_batch),
                         int_flag(cmd, ga_flag, defaults.grad_accum)};
  CZ_CHECK(first.micro_batch > 0 && first.grad_accum > 0, "the command's {} and {} must be positive", mb_flag,
           ga_flag);
  CZ_CHECK(o.min_ranks >= 1 && o.min_ranks <= first.world,
           "--min-ranks {} must be between 1 and the hostfile's {} slots", o.min_ranks, first.world);
  CZ_CHECK(o.max_restarts >= 0, "--max-restarts must be at least 0, got {}", o.max_restarts);
  if (every <= 0)
    say(
        fmt::format("warning: the command has no {} N: a restart goes back to the last checkpoint of an "
                    "earlier run, or to step 0",
                    every_flag));
  const std::string work = o.work_dir.empty() ? *ck_dir + "/czrun" : o.work_dir;
  ckpt::detail::make_dirs(work);
  const EventLog log(flag_value(cmd, log_flag).value_or(""), /*truncate=*/true);
  const EventLog events(work + "/events.jsonl", /*truncate=*/true);
  auto event = [&](nlohmann::json e) {
    e["t"] = unix_time();
    log.append(e);
    events.append(e);
  };
  install_handlers();
  // srun passes its environment on: the ranks learn that a supervisor stops them (as mpirun's -x tells them).
  if (o.srun) ::setenv("CZ_SUPERVISOR", "czrun", 1);

  std::vector<Host> active = all_hosts;
  std::optional<std::string> resume = flag_value(cmd, resume_flag);
  int64_t resumed_step = 0;
  int restarts = 0;
  int64_t steps_lost_total = 0;
  std::vector<nlohmann::json> failures;
  nlohmann::json pending_restart;  // the failure event, finished with the next attempt's timings
  for (int attempt = 0;; ++attempt) {
    if (attempt > 0 && g_stop_requests > 0) {
      // Asked to stop between attempts (while probing): no relaunch; what is published stays resumable.
      const auto newest = newest_checkpoint(*ck_dir);
      const std::string why = fmt::format("stopped on request before restart {}; resume from {}", restarts,
                                          newest ? newest->second : std::string("nothing (no checkpoint)"));
      say(why);
      say_resume_command(o, *ck_dir, newest.has_value());
      if (!pending_restart.is_null()) {
        event(pending_restart);
        failures.push_back(pending_restart);
      }
      event({{"event", "summary"},
             {"failures", failures},
             {"status", "stopped"},
             {"steps", resumed_step},
             {"restarts", restarts - 1},
             {"steps_lost", steps_lost_total},
             {"reason", why}});
      return 75;
    }
    const std::optional<BatchShape> shape = resize(first, total_slots(active), o.min_ranks);
    if (!shape) {
      const std::string why = fmt::format(
          "giving up: the {} slots left ({}) hold no world size from --min-ranks {} up that divides the "
          "global "
          "batch {}",
          total_slots(active), fmt::join(names_of(active), ", "), o.min_ranks, first.global_batch());
      say(why);
      event({{"event", "give_up"}, {"reason", why}});
      return 1;
    }
    const std::vector<Host> used = take_slots(active, shape->world);
    const std::string hostfile = fmt::format("{}/hostfile-{}", work, attempt);
    const std::string attempt_log = fmt::format("{}/attempt-{}.jsonl", work, attempt);
    write_hostfile(hostfile, used);
    std::remove(attempt_log.c_str());
    std::vector<std::string> run = cmd;
    run = with_flag(run, log_flag, attempt_log);
    if (attempt > 0) {
      run = with_flag(run, mb_flag, std::to_string(shape->micro_batch));
      run = with_flag(run, ga_flag, std::to_string(shape->grad_accum));
      if (resume) run = with_flag(run, resume_flag, *resume);
    }
    const std::vector<std::string> argv = launch_command(o, used, hostfile, shape->world, run);
    if (attempt > 0) say(fmt::format("relaunching: {}", shell_words(argv)));
    event({{"event", "launch"},
           {"attempt", attempt},
           {"world", shape->world},
           {"hosts", names_of(used)},
           {"micro_batch", shape->micro_batch},
           {"grad_accum", shape->grad_accum},
           {"global_batch", shape->global_batch()},
           {"resume", resume.value_or("")}});
    const Attempt a = run_attempt(argv, attempt_log, o);
    const std::vector<nlohmann::json> records = read_records(attempt_log);
    const int64_t reached = last_step(records, resumed_step);
    if (!pending_restart.is_null()) {
      // The previous failure's timings, now that this attempt has (or has not) taken a step.
      auto& p = pending_restart;
      p["relaunch_and_load_s"] = a.t_first_step > 0 ? a.t_first_step - a.t_launch : -1.0;
      p["checkpoint_load_s"] = a.load_s;
      p["failure_to_first_step_s"] =
          a.t_first_step > 0 ? a.t_first_step - p["t_last_step"].get<double>() : -1.0;
      event(p);
      failures.push_back(p);
      pending_restart = nullptr;
    }
    if (a.stopped || a.exit_code == 0) {
      log.append_records(records, -1);
      const int code = a.stopped ? 75 : 0;
      nlohmann::json s = {{"event", "summary"},
                          {"status", a.stopped ? "stopped" : "done"},
                          {"steps", reached},
                          {"restarts", restarts},
                          {"world", shape->world},
                          {"hosts", names_of(used)},
                          {"steps_lost", steps_lost_total},
                          {"failures", failures}};
      event(s);
      say(fmt::format("{} at step {} on {} rank{} after {} restart(s), {} step(s) lost in all{}",
                      a.stopped ? "stopped on request" : "done", reached, shape->world,
                      shape->world == 1 ? "" : "s", restarts, steps_lost_total,
                      a.stopped
                          ? fmt::format("; resume from {}", newest_checkpoint(*ck_dir)
                                                                ? newest_checkpoint(*ck_dir)->second
                                                                : std::string("nothing (no checkpoint)"))
                          : ""));
      if (a.stopped) say_resume_command(o, *ck_dir, newest_checkpoint(*ck_dir).has_value());
      return code;
    }
    // A failure: which hosts still answer?
    const double t_probe = unix_time();
    std::vector<Host> candidates = o.readmit ? all_hosts : active;
    std::vector<std::vector<std::string>> probes;
    for (const Host& h : candidates) probes.push_back(probe_command(o, h));
    const std::vector<bool> answers = run_all(probes, o.probe_timeout_s);
    const double t_probed = unix_time();
    std::set<std::string> lost, back;
    std::vector<Host> next;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const bool was_active = std::any_of(active.begin(), active.end(),
                                          [&](const Host& h) { return h.name == candidates[i].name; });
      if (answers[i]) {
        next.push_back(candidates[i]);
        if (!was_active) back.insert(candidates[i].name);
      } else if (was_active) {
        lost.insert(candidates[i].name);
      }
    }
    if (reached == resumed_step && records.empty() && !a.failure_seen && lost.empty()) {
      const std::string why = fmt::format(
          "giving up: the job failed before its first step (mpirun exit {}) with every host answering, which "
          "is not a lost host; see its output above",
          a.exit_code);
      say(why);
      event({{"event", "give_up"}, {"reason", why}, {"exit_code", a.exit_code}});
      return 1;
    }
    ckpt::detail::remove_leftovers(*ck_dir);  // half-written checkpoints: never resumed from, now not seen
    const auto newest = newest_checkpoint(*ck_dir);
    const int64_t from = newest ? newest->first : 0;
    // Records past the checkpoint are redone by the next attempt; the log keeps each step once.
    log.append_records(records, from);
    const int64_t lost_steps = std::max<int64_t>(0, reached - from);
    const std::vector<int> lost_ranks = ranks_on(used, lost);
    ++restarts;
    const std::string where =
        lost.empty()
            ? (a.start_timed_out ? fmt::format("no step within --start-timeout {:.0f} s, every host answers",
                                               o.start_timeout_s)
                                 : fmt::format("every host answers (mpirun exit {})", a.exit_code))
            : fmt::format("lost host{} {} (ranks [{}] of {}) did not answer within {:.0f} s",
                          lost.size() > 1 ? "s" : "", fmt::join(lost, ", "), fmt::join(lost_ranks, ", "),
                          shape->world, o.probe_timeout_s);
    const std::string ck_text = newest
                                    ? fmt::format("the newest published checkpoint is {} ({} step{} lost)",
                                                  newest->second, lost_steps, lost_steps == 1 ? "" : "s")
                                    : fmt::format("no checkpoint was published ({} steps lost)", lost_steps);
    nlohmann::json f = {{"event", "restart"},
                        {"restart", restarts},
                        {"failed_at_step", reached},
                        {"exit_code", a.exit_code},
                        {"lost_hosts", std::vector<std::string>(lost.begin(), lost.end())},
                        {"lost_ranks", lost_ranks},
                        {"readmitted_hosts", std::vector<std::string>(back.begin(), back.end())},
                        {"old_world", shape->world},
                        {"checkpoint", newest ? newest->second : ""},
                        {"resume_step", from},
                        {"steps_lost", lost_steps},
                        {"t_last_step", a.t_last_growth > 0 ? a.t_last_growth : a.t_launch},
                        {"detection_s", (a.failure_seen ? a.t_failure : a.t_exit) -
                                            (a.t_last_growth > 0 ? a.t_last_growth : a.t_launch)},
                        {"teardown_s", a.failure_seen ? a.t_exit - a.t_failure : 0.0},
                        {"mpirun_killed", a.killed},
                        {"start_timeout", a.start_timed_out},
                        {"probe_s", t_probed - t_probe}};
    if (restarts > o.max_restarts) {
      const std::string why = fmt::format(
          "the job failed at step {}: {}; {}; giving up after {} restart(s) "
          "(--max-restarts {})",
          reached, where, ck_text, restarts - 1, o.max_restarts);
      say(why);
      f["event"] = "give_up";
      f["reason"] = why;
      event(f);
      return 1;
    }
    const std::optional<BatchShape> next_shape = resize(first, total_slots(next), o.min_ranks);
    say(fmt::format("the job failed at step {}: {}; {}; restart {} of {}{}{}", reached, where, ck_text,
                    restarts, o.max_restarts,
                    next_shape ? fmt::format(" at {}", describe(*next_shape)) : std::string(),
                    back.empty() ? std::string() : fmt::format(" (re-admitted: {})", fmt::join(back, ", "))));
    if (next_shape)
      f["new_world"] = next_shape->world, f["micro_batch"] = next_shape->micro_batch,
      f["grad_accum"] = next_shape->grad_accum;
    steps_lost_total += lost_steps;
    pending_restart = f;
    active = next;
    resume = newest ? std::optional<std::string>(newest->second) : std::nullopt;
    resumed_step = from;
  }
}

}  // namespace cz::elastic
