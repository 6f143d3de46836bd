// Every rank's ring of its last collectives, kept where the other ranks of its host can read it without it,
// and the hang report built from those rings when a collective times out (Note [Collective log]).
//
// Note [Collective log]: a hung job is explained by what each rank last did, and the rank that holds the
// others back is the one that cannot say: it is stopped, spinning in compute, or blocked in the kernel. So
// each rank writes its log into a slot of shared memory that the ranks of its host mapped at start-up, and a
// rank whose collective times out reads its host peers' slots directly; for ranks on other hosts it asks any
// live rank of that host, whose responder thread reads the slots there (hang_exchange.h). A slot holds
//   - per communicator (numbered by creation, which is collective and so in the same order on every rank):
//     its label and size and the sequence numbers of the last collective started and the last finished;
//   - a ring of the last kRing calls: communicator, op, bytes, sequence number (0 for send/recv), peer,
//     start and end times (CLOCK_MONOTONIC, one clock per host), state.
// A peer "reached" collective #s of communicator c when its slot says it started #s of c. Recording a call is
// a fetch_add on the ring's head and a dozen relaxed stores; an entry is written under its own sequence lock
// (odd while written), taken by compare-and-swap because an NCCL call can finish after 32 later ones reused
// its entry (the finish then leaves the entry alone). No allocation, no lock, no system call beyond the
// clock. Each slot's name is unlinked once every local peer has mapped it, so nothing is left in /dev/shm
// when a job is killed. Without shared memory (or before World::init) the slot is private: the report then
// says what it cannot know.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/comm/types.h"

namespace cz::dist {

// One rank's log as a plain copy: what a reader takes from a slot, and what crosses hosts.
struct LogImage {
  static constexpr int kRing = 32;
  static constexpr int kComms = 32;
  static constexpr int kLabel = 24;
  enum State : uint8_t { empty = 0, running = 1, done = 2, failed = 3 };
  struct Entry {
    uint64_t pos = 0;  // the ring's head when it began: orders the entries
    uint64_t seq = 0;  // per communicator, 1-based; 0 for send/recv
    int64_t bytes = 0;
    int64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC of the rank's host; end 0 while running
    int32_t comm = -1;                 // the communicator's number
    int32_t peer = -1;                 // send/recv: the world rank of the peer
    uint8_t op = 0;                    // Collective
    uint8_t state = empty;
    uint8_t pad[6] = {};
  };
  struct Comm {
    int32_t id = -1;  // creation number; the table holds id % kComms
    int32_t size = 0;
    uint64_t started = 0, finished = 0;  // sequence numbers
    char label[kLabel] = {};
  };
  int32_t rank = -1;
  int32_t pid = 0;
  int64_t now_ns = 0;     // when the copy was taken, on the same clock as the entries
  char proc_state = '?';  // /proc/PID/stat's state letter when read on the rank's host (T: stopped)
  uint8_t pad[7] = {};
  Comm comms[kComms];
  Entry ring[kRing];  // in the slot's order; entries() sorts them

  const Comm* comm(int id) const;
  // The valid entries, newest first.
  std::vector<Entry> entries() const;
};

class CollectiveLog {
 public:
  // This process's log (a private slot until attach()).
  static CollectiveLog& local();

  // Collective over `node` (the ranks of one host, MPI_COMM_TYPE_SHARED): each rank puts its slot in shared
  // memory and maps every local peer's, by world rank. Returns "" or why the slots stay private (then only
  // this rank's own log is known). Before any communicator is made.
  std::string attach(MPI_Comm node, int world_rank);

  // A communicator was made (every member makes its communicators in the same order): its number.
  int add_comm(std::string_view label, int size);
  // Call `kind` of `bytes` starts on communicator `comm`; the returned ticket finishes it. `peer` for
  // send/recv (world rank). Cheap enough for every call (Note [Collective log]).
  struct Ticket {
    uint64_t pos = 0;  // ring position (head value)
    uint64_t seq = 0;
    int comm = -1;
  };
  Ticket begin(int comm, Collective kind, int64_t bytes, int peer = -1);
  void end(const Ticket& t, bool ok);

  // Copies: this rank's, and a local peer's (nullopt when not mapped). proc_state filled from /proc.
  LogImage image() const;
  std::optional<LogImage> image_of(int world_rank) const;
  // The world ranks whose slots this process mapped (itself included once attached).
  std::vector<int> mapped_ranks() const;

  static int64_t now_ns();

 private:
  struct Slot;
  CollectiveLog();
  static LogImage copy(const Slot& s, int rank);

  Slot* slot_ = nullptr;            // this rank's, private or shared
  std::vector<const Slot*> peers_;  // by world rank; null where not mapped
  std::vector<int> peer_pids_;
  int rank_ = -1;
  std::atomic<int> next_comm_{0};
};

// Which communicator a collective runs on and its number there: what a timeout report needs.
struct CollectiveId {
  int comm = -1;  // CollectiveLog number
  uint64_t seq = 0;
  Collective kind = Collective::barrier;
  int64_t bytes = 0;
};

// The explanation appended to a timeout message, from the logs of the group's ranks (`images[i]` for
// world rank `members[i]`, nullopt where unknown, `unknown_why[i]` then saying why), e.g.
// "; it is all_reduce #57 of 4.0 MiB on world: rank 1 never reached it; rank 1 (host h, pid 12, stopped)
// last did all_reduce #56 of 4.0 MiB on world, started 3.2 s ago, state done". `self`: this world rank.
struct PeerFacts {
  int rank = -1;
  std::string host;
  std::optional<LogImage> image;
  std::string unknown_why;  // where image is nullopt
};
// `others`: logs of ranks outside the group that came with the group's (the rest of their hosts): those that
// are stopped or gone are named too, as the cause a member waits for elsewhere.
std::string explain_timeout(const CollectiveId& id, std::string_view comm_label,
                            const std::vector<PeerFacts>& peers, int self,
                            const std::vector<PeerFacts>& others = {});
// One line per entry of `log`, newest first: "world all_reduce #57 of 4.0 MiB, started 3.0 s ago, running".
std::vector<std::string> format_log(const LogImage& log, int max_lines = LogImage::kRing);
// "4.0 MiB", "512 B".
std::string format_bytes(int64_t bytes);

}  // namespace cz::dist
