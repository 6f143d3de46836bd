// Gathering the group's logs on a timeout, from this host's slots and other hosts' responders (Note [Logs
// across hosts]), and printing this rank's own.
#include "dist/comm/hang_report.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "dist/comm/bootstrap.h"
#include "dist/comm/mpi_util.h"
#include "tensor/check.h"

namespace cz::dist {
namespace {

constexpr int kRequestTag = 1, kAnswerTag = 2;

struct Service {
  MPI_Comm comm = MPI_COMM_NULL;
  std::thread* thread = nullptr;  // never destroyed: a program that skips World::finalize must not terminate
  std::atomic<bool> stop{false};
  std::mutex ask_mu;  // one request round at a time: answers are received from any source
};

Service& service() {
  static Service* s = new Service();
  return *s;
}

void nap_ms(int ms) {
  const timespec ts{0, long(ms) * 1000000};
  nanosleep(&ts, nullptr);
}

// This host's logs, as copies (every slot this process mapped).
std::vector<LogImage> host_logs() {
  std::vector<LogImage> out;
  const CollectiveLog& log = CollectiveLog::local();
  for (int r : log.mapped_ranks())
    if (auto img = log.image_of(r)) out.push_back(*img);
  return out;
}

// The responder (Note [Logs across hosts]). MPI errors are ignored: the job is failing when this matters.
void respond(Service& s) {
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<LogImage> logs;
  };
  std::vector<std::unique_ptr<Pending>> pending;
  while (!s.stop.load()) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kRequestTag, s.comm, &flag, &st) == MPI_SUCCESS && flag) {
      int who = -1;
      MPI_Recv(&who, 1, MPI_INT, st.MPI_SOURCE, kRequestTag, s.comm, MPI_STATUS_IGNORE);
      auto p = std::make_unique<Pending>();
      p->logs = host_logs();
      if (MPI_Isend(p->logs.data(), int(p->logs.size() * sizeof(LogImage)), MPI_BYTE, st.MPI_SOURCE,
                    kAnswerTag, s.comm, &p->req) == MPI_SUCCESS)
        pending.push_back(std::move(p));
      continue;
    }
    for (size_t i = 0; i < pending.size();) {
      int done = 0;
      if (MPI_Test(&pending[i]->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        pending.erase(pending.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
    nap_ms(kResponderPollMs);
  }
  // Answers still unsent (a requester that died) are dropped with their buffers kept: the job is ending.
  for (auto& p : pending) (void)p.release();
}

}  // namespace

void start_log_service(int local_size) {
  const World& w = World::get();
  if (local_size >= w.size()) return;  // one host: every slot is mapped here
  Service& s = service();
  CZ_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm));
  MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN);
  s.stop.store(false);
  s.thread = new std::thread([&s] { respond(s); });
}

void stop_log_service() {
  Service& s = service();
  if (!s.thread) return;
  s.stop.store(true);
  s.thread->join();
  delete s.thread;
  s.thread = nullptr;
  MPI_Comm_free(&s.comm);
}

std::vector<PeerFacts> gather_logs(const std::vector<int>& ranks, std::vector<PeerFacts>* others) {
  const World& w = World::get();
  const CollectiveLog& log = CollectiveLog::local();
  std::vector<PeerFacts> facts;
  std::map<int, size_t> missing;  // world rank -> index in facts
  for (int r : ranks) {
    PeerFacts f;
    f.rank = r;
    f.host = w.peer(r).host;
    f.image = log.image_of(r);
    if (!f.image) missing[r] = facts.size();
    facts.push_back(std::move(f));
  }
  const auto other = [&](const LogImage& img) {
    if (!others || std::find(ranks.begin(), ranks.end(), img.rank) != ranks.end()) return;
    for (const PeerFacts& o : *others)
      if (o.rank == img.rank) return;
    others->push_back({img.rank, w.peer(img.rank).host, img, {}});
  };
  for (int r : log.mapped_ranks())
    if (auto img = log.image_of(r)) other(*img);
  Service& s = service();
  if (!s.thread) {
    for (auto& [r, i] : missing)
      facts[i].unknown_why = w.same_host(r) ? "its log is not in shared memory" : "no responder on its host";
    return facts;
  }
  // Every other host is asked, not only the group's: a group inside this host can wait for a member that is
  // itself held up across hosts by a rank elsewhere (a two-level collective's host level waiting for a rank
  // stuck in the cross level), and that rank is what the report must name.
  std::lock_guard<std::mutex> lock(s.ask_mu);
  std::set<std::string> hosts;
  for (int q = 0; q < w.size(); ++q)
    if (!w.same_host(q)) hosts.insert(w.peer(q).host);
  const std::vector<int> mapped = log.mapped_ranks();
  const int me = w.rank();
  for (int q = 0; q < w.size(); ++q) {
    if (!hosts.count(w.peer(q).host) || std::find(mapped.begin(), mapped.end(), q) != mapped.end()) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    // Small enough to go eagerly: a stopped or dead rank never receives it, and nobody waits for that.
    if (MPI_Isend(&me, 1, MPI_INT, q, kRequestTag, s.comm, &req) == MPI_SUCCESS) MPI_Request_free(&req);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kAnswerWaitS);
  size_t found = 0;
  std::set<std::string> answered;
  while ((found < missing.size() || answered.size() < hosts.size()) &&
         std::chrono::steady_clock::now() < deadline) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, s.comm, &flag, &st) != MPI_SUCCESS) break;
    if (!flag) {
      nap_ms(1);
      continue;
    }
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    std::vector<LogImage> logs(size_t(bytes) / sizeof(LogImage));
    if (MPI_Recv(logs.data(), bytes, MPI_BYTE, st.MPI_SOURCE, kAnswerTag, s.comm, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      break;
    answered.insert(w.peer(st.MPI_SOURCE).host);
    for (const LogImage& img : logs) {
      if (img.rank < 0 || img.rank >= w.size()) continue;
      other(img);
      const auto it = missing.find(img.rank);
      if (it == missing.end() || facts[it->second].image) continue;
      facts[it->second].image = img;
      ++found;
    }
  }
  for (auto& [r, i] : missing)
    if (!facts[i].image)
      facts[i].unknown_why =
          fmt::format("no rank of host {} answered within {:.0f} s", facts[i].host, kAnswerWaitS);
  return facts;
}

std::string hang_report(const CollectiveId& id, std::string_view label, const std::vector<int>& members) {
  try {
    if (!World::initialized()) return "";
    const World& w = World::get();
    std::string text =
        fmt::format("{}collectives of this rank, newest first (at the timeout of {} #{} on {}):\n",
                    log_prefix(), name(id.kind), id.seq, label);
    for (const std::string& line : format_log(CollectiveLog::local().image(), 16))
      text += fmt::format("{}  {}\n", log_prefix(), line);
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    const auto start = std::chrono::steady_clock::now();
    std::vector<PeerFacts> others;
    const std::vector<PeerFacts> peers = gather_logs(members, &others);
    std::string out = explain_timeout(id, label, peers, w.rank(), others);
    // Stay to answer the other hosts' questions before this rank's abort ends the job (Note [Logs across
    // hosts]).
    if (service().thread) std::this_thread::sleep_until(start + std::chrono::duration<double>(kLingerS));
    return out;
  } catch (const std::exception& e) {
    return fmt::format("; no hang report ({})", e.what());
  }
}

}  // namespace cz::dist
