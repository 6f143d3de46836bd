// World set-up (ranks, node-local ranks, GPU choice, peer table), liveness checks and the abort path.
#include "dist/comm/bootstrap.h"

#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include "dist/comm/collective_log.h"
#include "dist/comm/hang_report.h"
#include "dist/comm/mpi_util.h"
#include "dist/comm/signal_text.h"
#include "dist/comm/topology_detect.h"
#include "tensor/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/device.h"
#include "tensor/parallel.h"

namespace cz::dist {
namespace {

std::unique_ptr<World>& world_storage() {
  static std::unique_ptr<World> world;
  return world;
}

std::mutex& hooks_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<int, std::function<void()>>& hooks() {
  static std::map<int, std::function<void()>> h;
  return h;
}

// Note [Activity for signals]: the SIGTERM handler may only call async-signal-safe functions, so the current
// activity lives in two fixed buffers; writers fill the idle one and then publish its index.
SignalSafeText<256> g_activity;
char g_prefix[64] = "";
volatile sig_atomic_t g_aborting = 0;  // set once abort_world runs: the launcher's SIGTERM is then expected

// One of three SIGTERM handlers: Note [Three SIGTERM handlers] in src/dist/train/stop.cpp.
void on_sigterm(int sig) {
  if (g_aborting) _exit(128 + sig);
  write_stderr(g_prefix);
  write_stderr("terminated by the launcher (signal ");
  char num[16];
  int k = 0;
  for (int v = sig; v > 0 && k < 15; v /= 10) num[k++] = char('0' + v % 10);
  while (k > 0) {
    const char c[2] = {num[--k], 0};
    write_stderr(c);
  }
  const char* act = g_activity.get();
  if (act[0]) {
    write_stderr(") during ");
    write_stderr(act);
  } else {
    write_stderr(") while not communicating");
  }
  write_stderr(": another rank failed or died and the job is being stopped\n");
  _exit(128 + sig);
}

// Note [Output before abort]: MPI_Abort has the launcher kill every rank, and mpirun reads each rank's stdout
// and stderr through pipes in the same event loop that handles the abort request; nothing orders the two, so
// the message die() has just written could still sit in the pipe when the launcher tears the job down (in 1
// of 5 runs of the stalled-rank test the survivor's whole message was still unread when it called MPI_Abort).
// So before aborting, wait until the reader has emptied the pipes (FIONREAD counts the unread bytes, from
// either end), for at most kDrainTime: a reader that has stopped reading must not keep the job alive. Output
// to a terminal or a file is written through at once and needs no wait.
constexpr auto kDrainTime = std::chrono::seconds(2);

void drain_output() noexcept {
  const auto deadline = std::chrono::steady_clock::now() + kDrainTime;
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) continue;
    int unread = 0;
    while (ioctl(fd, FIONREAD, &unread) == 0 && unread > 0 && std::chrono::steady_clock::now() < deadline) {
      const timespec nap{0, 1000000};  // 1 ms
      nanosleep(&nap, nullptr);
    }
  }
}

// Note [Abort without a launcher]: MPI_Abort asks this host's Open MPI daemon to have mpirun kill the job.
// When the daemon or mpirun is gone or cut off (a host lost: its link down, mpirun killed by a supervisor
// such as czrun, Note [Elastic restarts] in src/dist/elastic/supervisor.h), nobody kills this rank, and
// nothing promises that MPI_Abort returns (a cut-off rank of the issue-23 trial still ran 40 s after its
// peers had aborted). So a rank that aborts also ends itself kAbortWatchdogSeconds later, whatever MPI_Abort
// does.
constexpr unsigned kAbortWatchdogSeconds = 10;
int g_watchdog_code = 1;

void on_watchdog(int) {
  _exit(g_watchdog_code);
}

void arm_exit_watchdog(int exit_code) noexcept {
  g_watchdog_code = exit_code;
  struct sigaction sa {};
  sa.sa_handler = on_watchdog;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  alarm(kAbortWatchdogSeconds);
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

}  // namespace

void set_current_activity(const std::string& what) {
  g_activity.set(what);
}

World& World::init(int* argc, char*** argv, const WorldOptions& options) {
  auto& w = world_storage();
  CZ_CHECK(!w, "World::init called twice");
  int initialized = 0;
  CZ_MPI(MPI_Initialized(&initialized));
  bool owns = false;
  if (!initialized) {
    int provided = 0;
    CZ_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      // Communication threads call MPI concurrently with the main thread (and with each other).
      throw CommError(fmt::format(
          "the MPI library provides thread level {} but convnext_zero needs MPI_THREAD_MULTIPLE ({}): its "
          "communicators progress on their own threads",
          provided, int(MPI_THREAD_MULTIPLE)));
    }
  } else {
    int provided = 0;
    CZ_MPI(MPI_Query_thread(&provided));
    CZ_CHECK_T(CommError, provided >= MPI_THREAD_MULTIPLE,
               "MPI was initialised at thread level {}; convnext_zero needs MPI_THREAD_MULTIPLE", provided);
  }
  w.reset(new World());
  w->owns_mpi_ = owns;
  w->setup(options);
  return *w;
}

World& World::get() {
  auto& w = world_storage();
  CZ_ASSERT(w, "World::get() before World::init()");
  return *w;
}

bool World::initialized() {
  return world_storage() != nullptr;
}

void World::finalize() {
  auto& w = world_storage();
  if (!w) return;
  const bool owns = w->owns_mpi_;
  stop_log_service();
  w.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns && !finalized) MPI_Finalize();
}

void World::setup(const WorldOptions& options) {
  CZ_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  CZ_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  set_log_prefix(fmt::format("[rank {}] ", rank_));
  fmt::format_to_n(g_prefix, sizeof(g_prefix) - 1, "[rank {}] ", rank_);
  launched_ = env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMI_SIZE") || env_set("PMIX_RANK") ||
              env_set("SLURM_PROCID");

  MPI_Comm node = MPI_COMM_NULL;
  CZ_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  CZ_MPI(MPI_Comm_rank(node, &local_rank_));
  CZ_MPI(MPI_Comm_size(node, &local_size_));
  if (options.select_gpu && cuda_device_count() > 0) {
    gpu_ = local_rank_ % cuda_device_count();
    cuda_runtime::set_device(gpu_);
  }
  gather_node_cpus(node);
  // Note [Collective log]: without shared memory this rank's log stays private (its report says so).
  CollectiveLog::local().attach(node, rank_);
  CZ_MPI(MPI_Comm_free(&node));

  // Peer table: pid and hostname of every rank.
  constexpr int kHostLen = 256;
  struct Entry {
    int pid;
    char host[kHostLen];
  };
  Entry mine{};
  mine.pid = int(getpid());
  gethostname(mine.host, kHostLen - 1);
  // $CZ_SIMULATE_HOSTS=R: every R consecutive ranks count as one host, named "<host>~<k>", so that the
  // multi-host code paths (Note [2-D mesh]) can be tested on one machine. Only the host names change:
  // ranks on other simulated hosts are then not watched for liveness (their failures surface as timeouts).
  if (const char* sim = std::getenv("CZ_SIMULATE_HOSTS"); sim && *sim) {
    const int per = std::atoi(sim);
    CZ_CHECK(per >= 1 && size_ % per == 0,
             "$CZ_SIMULATE_HOSTS={} must be a number of ranks dividing the {} ranks", sim, size_);
    const std::string name = fmt::format("{}~{}", mine.host, rank_ / per);
    fmt::format_to_n(mine.host, kHostLen - 1, "{}", name).out[0] = '\0';
  }
  std::vector<Entry> all(static_cast<size_t>(size_));
  CZ_MPI(MPI_Allgather(&mine, int(sizeof(Entry)), MPI_BYTE, all.data(), int(sizeof(Entry)), MPI_BYTE,
                       MPI_COMM_WORLD));
  peers_.resize(size_t(size_));
  pid_visible_.assign(size_t(size_), false);
  for (int r = 0; r < size_; ++r) {
    peers_[size_t(r)] = {all[size_t(r)].pid, std::string(all[size_t(r)].host)};
  }
  for (int r = 0; r < size_; ++r) {
    // A peer on this host whose pid we cannot see lives in another pid namespace (another container).
    pid_visible_[size_t(r)] = r != rank_ && same_host(r) && ::kill(peers_[size_t(r)].pid, 0) == 0;
  }

  start_log_service(local_size_);  // Note [Logs across hosts]
  if (options.configure_threads) configure_cpu_threads(int(cpu_share().cpus.size()));
  if (options.install_signal_handlers) {
    struct sigaction sa {};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

void World::gather_node_cpus(MPI_Comm node) {
  // Two CPU sets a rank: its affinity mask and the CPUs near its GPU (none on a CPU rank).
  constexpr int kWords = CPU_SETSIZE / 64;
  const auto to_bits = [](const std::vector<int>& cpus, uint64_t* bits) {
    for (int c : cpus)
      if (c >= 0 && c < CPU_SETSIZE) bits[c / 64] |= uint64_t(1) << (c % 64);
  };
  const auto from_bits = [](const uint64_t* bits) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (bits[c / 64] >> (c % 64) & 1) cpus.push_back(c);
    return cpus;
  };
  std::vector<uint64_t> mine(2 * kWords, 0), all(size_t(local_size_) * 2 * kWords, 0);
  to_bits(affinity_cpus(), mine.data());
  if (gpu_ >= 0) to_bits(pci_local_cpus(sysfs_root(), cuda_busid(gpu_)), mine.data() + kWords);
  CZ_MPI(MPI_Allgather(mine.data(), 2 * kWords, MPI_UINT64_T, all.data(), 2 * kWords, MPI_UINT64_T, node));
  node_cpus_.resize(size_t(local_size_));
  std::vector<int> every;
  for (int r = 0; r < local_size_; ++r) {
    const uint64_t* b = all.data() + size_t(r) * 2 * kWords;
    node_cpus_[size_t(r)] = {from_bits(b), from_bits(b + kWords)};
    every.insert(every.end(), node_cpus_[size_t(r)].mask.begin(), node_cpus_[size_t(r)].mask.end());
  }
  std::sort(every.begin(), every.end());
  every.erase(std::unique(every.begin(), every.end()), every.end());
  node_shares_ = share_node_cpus(node_cpus_, read_core_of(every));
}

bool World::peer_alive(int rank) const {
  if (rank < 0 || rank >= size_ || !pid_visible_[size_t(rank)]) return true;
  const int pid = peers_[size_t(rank)].pid;
  if (::kill(pid, 0) != 0) return errno != ESRCH;
  // A killed child stays a zombie until its launcher reaps it; its state letter follows the ") ".
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  const char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

int add_abort_hook(std::function<void()> hook) {
  static int next_id = 0;
  std::lock_guard<std::mutex> lock(hooks_mutex());
  hooks()[++next_id] = std::move(hook);
  return next_id;
}

void remove_abort_hook(int id) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  hooks().erase(id);
}

void abort_world(int exit_code) noexcept {
  g_aborting = 1;
  std::map<int, std::function<void()>> h;
  {
    std::lock_guard<std::mutex> lock(hooks_mutex());
    h = hooks();
  }
  for (auto& [id, fn] : h) {
    try {
      fn();
    } catch (...) {
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  drain_output();                // Note [Output before abort]
  arm_exit_watchdog(exit_code);  // Note [Abort without a launcher]
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  // A world of one has nobody to stop (and a singleton's MPI_Abort only adds launcher noise).
  const bool alone = world_storage() && world_storage()->size() == 1;
  if (initialized && !finalized && !alone) MPI_Abort(MPI_COMM_WORLD, exit_code);
  _exit(exit_code);
}

void die(const std::exception& e) noexcept {
  std::string msg = e.what();
  // Status-code errors already carry the rank prefix.
  const std::string& prefix = log_prefix();
  if (!prefix.empty() && msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
  std::fprintf(stderr, "%s%s; aborting\n", prefix.c_str(), msg.c_str());
  abort_world(1);
}

}  // namespace cz::dist
