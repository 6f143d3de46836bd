// The collective log's slots in shared memory, their copies, and the text of a timeout report (Note
// [Collective log]).
#include "dist/comm/collective_log.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>

#include <fmt/format.h>

#include "dist/comm/mpi_util.h"

namespace cz::dist {

struct CollectiveLog::Slot {
  struct Comm {
    std::atomic<int32_t> id{-1};
    std::atomic<int32_t> size{0};
    std::atomic<uint64_t> started{0}, finished{0};
    char label[LogImage::kLabel] = {};  // written before id is published
  };
  struct Entry {
    std::atomic<uint32_t> version{0};  // odd while written
    std::atomic<uint32_t> meta{0};     // op | state << 8
    std::atomic<int32_t> comm{-1}, peer{-1};
    std::atomic<uint64_t> pos{0}, seq{0};
    std::atomic<int64_t> bytes{0}, start_ns{0}, end_ns{0};
  };
  std::atomic<int32_t> pid{0};
  std::atomic<uint64_t> head{0};
  Comm comms[LogImage::kComms];
  Entry ring[LogImage::kRing];
};

namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "the collective log's slots are shared between processes: their atomics must be lock-free");

// Takes an entry's sequence lock. Writers of one entry are the thread that began it and a later begin() on
// the same ring position; both hold it for a few stores.
uint32_t lock_entry(std::atomic<uint32_t>& version) {
  uint32_t v = version.load(std::memory_order_relaxed);
  for (;;) {
    if (v & 1u) {
      v = version.load(std::memory_order_relaxed);
      continue;
    }
    if (version.compare_exchange_weak(v, v + 1, std::memory_order_acquire, std::memory_order_relaxed))
      return v;
  }
}

char proc_state(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return '?';
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

}  // namespace

const LogImage::Comm* LogImage::comm(int id) const {
  if (id < 0) return nullptr;
  const Comm& c = comms[id % kComms];
  return c.id == id ? &c : nullptr;
}

std::vector<LogImage::Entry> LogImage::entries() const {
  std::vector<Entry> out;
  for (const Entry& e : ring)
    if (e.state != empty) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.pos > b.pos; });
  return out;
}

CollectiveLog::CollectiveLog() : slot_(new Slot()) {
  slot_->pid.store(int32_t(getpid()));
}

CollectiveLog& CollectiveLog::local() {
  static CollectiveLog* log = new CollectiveLog();  // never destroyed: communication threads may outlive main
  return *log;
}

int64_t CollectiveLog::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string CollectiveLog::attach(MPI_Comm node, int world_rank) {
  rank_ = world_rank;
  int world = 1, local = 0, local_size = 1;
  CZ_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  CZ_MPI(MPI_Comm_rank(node, &local));
  CZ_MPI(MPI_Comm_size(node, &local_size));
  peers_.assign(size_t(world), nullptr);
  peer_pids_.assign(size_t(world), 0);
  peers_[size_t(world_rank)] = slot_;
  peer_pids_[size_t(world_rank)] = int(getpid());
  // Named by the pid of the node's first rank, unique on the host while the job runs.
  int first_pid = int(getpid());
  CZ_MPI(MPI_Bcast(&first_pid, 1, MPI_INT, 0, node));
  const auto name_of = [&](int r) { return fmt::format("/cz-log-{}-{}", first_pid, r); };
  const std::string mine = name_of(world_rank);
  std::string why;
  Slot* shared = nullptr;
  const int fd = shm_open(mine.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  if (fd < 0) {
    why = fmt::format("shm_open {}: {}", mine, std::strerror(errno));
  } else {
    void* p = MAP_FAILED;
    if (ftruncate(fd, off_t(sizeof(Slot))) == 0)
      p = mmap(nullptr, sizeof(Slot), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      why = fmt::format("mapping {}: {}", mine, std::strerror(errno));
      shm_unlink(mine.c_str());
    } else {
      shared = new (p) Slot();
      shared->pid.store(int32_t(getpid()));
    }
    close(fd);
  }
  struct Facts {
    int ok, rank, pid;
  };
  const Facts me{shared != nullptr, world_rank, int(getpid())};
  std::vector<Facts> all(static_cast<size_t>(local_size));
  CZ_MPI(MPI_Allgather(&me, 3, MPI_INT, all.data(), 3, MPI_INT, node));
  if (shared) {
    // Nothing was recorded before (no communicator exists yet), so the private slot has nothing to carry.
    delete slot_;
    slot_ = shared;
    peers_[size_t(world_rank)] = slot_;
  }
  for (int i = 0; i < local_size; ++i) {
    const Facts& f = all[size_t(i)];
    if (i == local || !f.ok) continue;
    const int pfd = shm_open(name_of(f.rank).c_str(), O_RDONLY, 0);
    if (pfd < 0) continue;
    void* p = mmap(nullptr, sizeof(Slot), PROT_READ, MAP_SHARED, pfd, 0);
    close(pfd);
    if (p == MAP_FAILED) continue;
    peers_[size_t(f.rank)] = static_cast<const Slot*>(p);
    peer_pids_[size_t(f.rank)] = f.pid;
  }
  CZ_MPI(MPI_Barrier(node));  // every peer has mapped this slot: its name can go
  if (shared) shm_unlink(mine.c_str());
  return why;
}

int CollectiveLog::add_comm(std::string_view label, int size) {
  const int id = next_comm_.fetch_add(1);
  Slot::Comm& c = slot_->comms[id % LogImage::kComms];
  c.id.store(-1, std::memory_order_relaxed);
  std::memset(c.label, 0, sizeof(c.label));
  std::memcpy(c.label, label.data(), std::min(label.size(), sizeof(c.label) - 1));
  c.size.store(size, std::memory_order_relaxed);
  c.started.store(0, std::memory_order_relaxed);
  c.finished.store(0, std::memory_order_relaxed);
  c.id.store(id, std::memory_order_release);
  return id;
}

CollectiveLog::Ticket CollectiveLog::begin(int comm, Collective kind, int64_t bytes, int peer) {
  Ticket t;
  t.comm = comm;
  const bool p2p = kind == Collective::send || kind == Collective::recv;
  if (!p2p && comm >= 0)
    t.seq = slot_->comms[comm % LogImage::kComms].started.fetch_add(1, std::memory_order_acq_rel) + 1;
  t.pos = slot_->head.fetch_add(1, std::memory_order_relaxed);
  Slot::Entry& e = slot_->ring[t.pos % LogImage::kRing];
  const uint32_t v = lock_entry(e.version);
  e.meta.store(uint32_t(kind) | uint32_t(LogImage::running) << 8, std::memory_order_relaxed);
  e.comm.store(comm, std::memory_order_relaxed);
  e.peer.store(peer, std::memory_order_relaxed);
  e.pos.store(t.pos, std::memory_order_relaxed);
  e.seq.store(t.seq, std::memory_order_relaxed);
  e.bytes.store(bytes, std::memory_order_relaxed);
  e.start_ns.store(now_ns(), std::memory_order_relaxed);
  e.end_ns.store(0, std::memory_order_relaxed);
  e.version.store(v + 2, std::memory_order_release);
  return t;
}

void CollectiveLog::end(const Ticket& t, bool ok) {
  if (t.comm < 0) return;
  if (ok && t.seq > 0) {
    std::atomic<uint64_t>& f = slot_->comms[t.comm % LogImage::kComms].finished;
    uint64_t cur = f.load(std::memory_order_relaxed);
    while (cur < t.seq && !f.compare_exchange_weak(cur, t.seq, std::memory_order_release)) {
    }
  }
  Slot::Entry& e = slot_->ring[t.pos % LogImage::kRing];
  const uint32_t v = lock_entry(e.version);
  if (e.pos.load(std::memory_order_relaxed) == t.pos) {
    const uint32_t op = e.meta.load(std::memory_order_relaxed) & 0xffu;
    e.meta.store(op | uint32_t(ok ? LogImage::done : LogImage::failed) << 8, std::memory_order_relaxed);
    e.end_ns.store(now_ns(), std::memory_order_relaxed);
  }
  e.version.store(v + 2, std::memory_order_release);
}

LogImage CollectiveLog::copy(const Slot& s, int rank) {
  LogImage img;
  img.rank = rank;
  img.pid = s.pid.load(std::memory_order_relaxed);
  img.now_ns = now_ns();
  for (int i = 0; i < LogImage::kComms; ++i) {
    const Slot::Comm& c = s.comms[i];
    LogImage::Comm& o = img.comms[i];
    o.id = c.id.load(std::memory_order_acquire);
    if (o.id < 0) continue;
    o.size = c.size.load(std::memory_order_relaxed);
    o.started = c.started.load(std::memory_order_relaxed);
    o.finished = c.finished.load(std::memory_order_relaxed);
    std::memcpy(o.label, c.label, sizeof(o.label));
    o.label[LogImage::kLabel - 1] = '\0';
  }
  for (int i = 0; i < LogImage::kRing; ++i) {
    const Slot::Entry& e = s.ring[i];
    LogImage::Entry& o = img.ring[i];
    // A writer stopped inside its few stores (SIGSTOP) never releases the entry: after some tries take what
    // is there, which is all that will ever be there.
    for (int tries = 0; tries < 1000; ++tries) {
      const uint32_t v1 = e.version.load(std::memory_order_acquire);
      const uint32_t meta = e.meta.load(std::memory_order_relaxed);
      o.op = uint8_t(meta & 0xffu);
      o.state = uint8_t(meta >> 8);
      o.comm = e.comm.load(std::memory_order_relaxed);
      o.peer = e.peer.load(std::memory_order_relaxed);
      o.pos = e.pos.load(std::memory_order_relaxed);
      o.seq = e.seq.load(std::memory_order_relaxed);
      o.bytes = e.bytes.load(std::memory_order_relaxed);
      o.start_ns = e.start_ns.load(std::memory_order_relaxed);
      o.end_ns = e.end_ns.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (!(v1 & 1u) && e.version.load(std::memory_order_relaxed) == v1) break;
    }
  }
  return img;
}

LogImage CollectiveLog::image() const {
  LogImage img = copy(*slot_, rank_);
  img.proc_state = 'R';
  return img;
}

std::optional<LogImage> CollectiveLog::image_of(int world_rank) const {
  if (world_rank == rank_) return image();
  if (world_rank < 0 || size_t(world_rank) >= peers_.size() || !peers_[size_t(world_rank)])
    return std::nullopt;
  LogImage img = copy(*peers_[size_t(world_rank)], world_rank);
  img.proc_state = proc_state(peer_pids_[size_t(world_rank)]);
  return img;
}

std::vector<int> CollectiveLog::mapped_ranks() const {
  std::vector<int> out;
  for (size_t r = 0; r < peers_.size(); ++r)
    if (peers_[r]) out.push_back(int(r));
  return out;
}

// --- the report's text ---

std::string format_bytes(int64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = double(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

namespace {

const char* state_name(uint8_t s) {
  switch (s) {
    case LogImage::running:
      return "running";
    case LogImage::done:
      return "done";
    case LogImage::failed:
      return "failed";
    default:
      return "unknown";
  }
}

std::string comm_label(const LogImage& log, int comm) {
  const LogImage::Comm* c = log.comm(comm);
  return c ? std::string(c->label) : fmt::format("communicator {}", comm);
}

// "all_reduce #56 of 4.0 MiB on world", "send of 64 B to rank 2 on world".
std::string describe(const LogImage& log, const LogImage::Entry& e) {
  const Collective kind = Collective(e.op);
  const std::string label = comm_label(log, e.comm);
  if (kind == Collective::send || kind == Collective::recv)
    return fmt::format("{} of {} {} rank {} on {}", name(kind), format_bytes(e.bytes),
                       kind == Collective::send ? "to" : "from", e.peer, label);
  return fmt::format("{} #{} of {} on {}", name(kind), e.seq, format_bytes(e.bytes), label);
}

std::string age(const LogImage& log, int64_t t_ns) {
  return fmt::format("{:.1f} s", double(log.now_ns - t_ns) / 1e9);
}

// ", stopped" for the states a hang report must name (/proc's letters).
std::string proc_note(char state) {
  switch (state) {
    case 'T':
      return ", stopped";
    case 't':
      return ", stopped by a debugger";
    case 'Z':
    case 'X':
      return ", exited";
    case 'D':
      return ", in uninterruptible sleep";
    default:
      return "";
  }
}

}  // namespace

std::vector<std::string> format_log(const LogImage& log, int max_lines) {
  std::vector<std::string> lines;
  for (const LogImage::Entry& e : log.entries()) {
    if (int(lines.size()) >= max_lines) break;
    std::string line =
        fmt::format("{}, started {} ago, {}", describe(log, e), age(log, e.start_ns), state_name(e.state));
    if (e.state != LogImage::running && e.end_ns > 0)
      line += fmt::format(" after {:.3f} s", double(e.end_ns - e.start_ns) / 1e9);
    lines.push_back(std::move(line));
  }
  return lines;
}

std::string explain_timeout(const CollectiveId& id, std::string_view comm_label_text,
                            const std::vector<PeerFacts>& peers, int self,
                            const std::vector<PeerFacts>& others) {
  const bool p2p = id.kind == Collective::send || id.kind == Collective::recv;
  std::string out;
  if (p2p)
    out = fmt::format("; it is a {} of {} on {}", name(id.kind), format_bytes(id.bytes), comm_label_text);
  else
    out = fmt::format("; it is {} #{} of {} on {}", name(id.kind), id.seq, format_bytes(id.bytes),
                      comm_label_text);
  std::vector<int> never, unknown;
  for (const PeerFacts& p : peers) {
    if (p.rank == self) continue;
    if (!p.image) {
      unknown.push_back(p.rank);
      continue;
    }
    const LogImage::Comm* c = p.image->comm(id.comm);
    if (!p2p && (!c || c->started < id.seq)) never.push_back(p.rank);
  }
  const auto ranks_text = [](const std::vector<int>& r) {
    return r.size() == 1 ? fmt::format("rank {}", r[0]) : fmt::format("ranks {}", rank_list(r));
  };
  if (!p2p) {
    if (!never.empty())
      out += fmt::format(": {} never reached it", ranks_text(never));
    else if (unknown.empty())
      out += ": every rank reached it";
    else
      out += fmt::format(": every rank whose log could be read reached it");
  }
  // "rank 2 (host h, pid 12, stopped) last did ..."
  const auto describe_rank = [&](const PeerFacts& p, const std::string& note) {
    const LogImage& log = *p.image;
    std::string text = fmt::format("rank {} (host {}, pid {}{})", p.rank, p.host, log.pid, note);
    const std::vector<LogImage::Entry> entries = log.entries();
    if (entries.empty()) return text + " has run no collective";
    const LogImage::Entry& last = entries.front();
    text += fmt::format(" last did {}, started {} ago, state {}", describe(log, last),
                        age(log, last.start_ns), state_name(last.state));
    // Where it stands on this communicator, when its last call was elsewhere.
    const LogImage::Comm* c = log.comm(id.comm);
    if (!p2p && c && last.comm != id.comm)
      text += fmt::format(" (on {} it started #{}, finished #{})", c->label, c->started, c->finished);
    return text;
  };
  for (const PeerFacts& p : peers) {
    if (p.rank == self) continue;
    if (!p.image) {
      out += fmt::format("; rank {} (host {}): not known ({})", p.rank, p.host, p.unknown_why);
      continue;
    }
    const bool missing = std::find(never.begin(), never.end(), p.rank) != never.end();
    const std::string note = proc_note(p.image->proc_state);
    if (!missing && note.empty() && !p2p) continue;  // reached it and runs: nothing to say
    out += "; " + describe_rank(p, note);
  }
  // A rank outside the group can hold it back through a member that waits for it elsewhere (a two-level
  // collective's host level): name the ones that cannot run.
  for (const PeerFacts& p : others) {
    const std::string note = p.image ? proc_note(p.image->proc_state) : "";
    if (!note.empty()) out += "; outside the group, " + describe_rank(p, note);
  }
  return out;
}

}  // namespace cz::dist
