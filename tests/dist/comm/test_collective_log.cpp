// The collective log (dist/comm/collective_log.h): the ring's order, sequence numbers and states, wrapping,
// a finish after the entry was reused, copies taken while two threads write, and the timeout report's text.
// A real hang: tests/dist/comm/run_hang_report_test.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "dist/comm/collective_log.h"

namespace cz::dist {
namespace {

TEST(CollectiveLog, RingOrderSequenceAndStates) {
  CollectiveLog& log = CollectiveLog::local();
  const int a = log.add_comm("world", 4), b = log.add_comm("shard", 2);
  const auto t1 = log.begin(a, Collective::all_reduce, 1024);
  log.end(t1, true);
  const auto t2 = log.begin(b, Collective::reduce_scatter, 2048);
  const auto t3 = log.begin(a, Collective::send, 64, 3);
  const auto t4 = log.begin(a, Collective::all_gather, 4096);
  log.end(t2, false);
  EXPECT_EQ(t1.seq, 1u);
  EXPECT_EQ(t2.seq, 1u);  // per communicator
  EXPECT_EQ(t3.seq, 0u);  // send/recv are not numbered
  EXPECT_EQ(t4.seq, 2u);
  const LogImage img = log.image();
  ASSERT_NE(img.comm(a), nullptr);
  EXPECT_STREQ(img.comm(a)->label, "world");
  EXPECT_EQ(img.comm(a)->started, 2u);
  EXPECT_EQ(img.comm(a)->finished, 1u);
  EXPECT_EQ(img.comm(b)->finished, 0u);  // failed
  const auto lines = format_log(img, 4);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].rfind("all_gather #2 of 4.0 KiB on world, started ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("ago, running"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].rfind("send of 64 B to rank 3 on world", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("reduce_scatter #1 of 2.0 KiB on shard", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find(", failed after "), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find(", done after "), std::string::npos) << lines[3];
  log.end(t3, true);
  log.end(t4, true);
}

TEST(CollectiveLog, WrapsAndIgnoresTheFinishOfAReusedEntry) {
  CollectiveLog& log = CollectiveLog::local();
  const int c = log.add_comm("wrap", 2);
  const auto old = log.begin(c, Collective::all_reduce, 8);
  for (int i = 0; i < LogImage::kRing; ++i) log.end(log.begin(c, Collective::all_reduce, 16 * (i + 1)), true);
  log.end(old, true);  // its entry now holds a later call, which must stay as it is
  const std::vector<LogImage::Entry> e = log.image().entries();
  ASSERT_EQ(e.size(), size_t(LogImage::kRing));
  EXPECT_EQ(e.front().seq, uint64_t(LogImage::kRing) + 1);
  EXPECT_EQ(e.back().seq, 2u);  // #1 fell out
  for (const auto& x : e) EXPECT_EQ(x.bytes, int64_t(16 * (x.seq - 1)));
  EXPECT_EQ(log.image().comm(c)->finished, uint64_t(LogImage::kRing) + 1);
}

// Two writers on two communicators (as two communication threads) while copies are taken: every entry of
// every copy is whole (its bytes match its sequence number).
TEST(CollectiveLog, CopiesAreWholeWhileWritten) {
  CollectiveLog& log = CollectiveLog::local();
  const int c0 = log.add_comm("w0", 2), c1 = log.add_comm("w1", 2);
  std::atomic<bool> stop{false};
  auto writer = [&](int c) {
    while (!stop.load()) {
      const uint64_t next = log.image().comm(c)->started + 1;
      log.end(log.begin(c, Collective::all_reduce, int64_t(next) * 8), true);
    }
  };
  std::thread w0(writer, c0), w1(writer, c1);
  for (int i = 0; i < 2000; ++i)
    for (const auto& e : log.image().entries())
      if (e.comm == c0 || e.comm == c1) ASSERT_EQ(e.bytes, int64_t(e.seq) * 8);
  stop = true;
  w0.join();
  w1.join();
}

LogImage made_log(int rank, int pid, char state, uint64_t started_on_world) {
  LogImage img;
  img.rank = rank;
  img.pid = pid;
  img.proc_state = state;
  img.now_ns = int64_t(100e9);
  img.comms[0].id = 0;
  img.comms[0].size = 4;
  img.comms[0].started = started_on_world;
  img.comms[0].finished = started_on_world;
  std::strcpy(img.comms[0].label, "world");
  img.comms[1].id = 1;
  img.comms[1].size = 2;
  img.comms[1].started = 7;
  std::strcpy(img.comms[1].label, "shard");
  LogImage::Entry& e = img.ring[0];
  e.pos = 10;
  e.seq = 7;
  e.comm = 1;
  e.op = uint8_t(Collective::reduce_scatter);
  e.bytes = int64_t(12.5 * 1024 * 1024);
  e.start_ns = int64_t(68.8e9);
  e.state = LogImage::running;
  return img;
}

TEST(HangReport, NamesTheRankThatNeverReachedItAndWhatItLastDid) {
  const CollectiveId id{0, 1234, Collective::all_reduce, 25 * 1024 * 1024};
  std::vector<PeerFacts> peers(4);
  for (int r = 0; r < 4; ++r) {
    peers[size_t(r)].rank = r;
    peers[size_t(r)].host = r < 2 ? "a" : "b";
    peers[size_t(r)].image = made_log(r, 100 + r, 'S', 1234);
  }
  peers[2].image = made_log(2, 102, 'T', 1233);
  EXPECT_EQ(
      explain_timeout(id, "world", peers, 0),
      "; it is all_reduce #1234 of 25.0 MiB on world: rank 2 never reached it; rank 2 (host b, pid 102, "
      "stopped) last did reduce_scatter #7 of 12.5 MiB on shard, started 31.2 s ago, state running (on "
      "world it started #1233, finished #1233)");
  // A rank whose log nobody could read, and every other one reached it.
  peers[2].image = made_log(2, 102, 'S', 1234);
  peers[3].image.reset();
  peers[3].unknown_why = "no rank of host b answered within 2 s";
  EXPECT_EQ(
      explain_timeout(id, "world", peers, 0),
      "; it is all_reduce #1234 of 25.0 MiB on world: every rank whose log could be read reached it; rank "
      "3 (host b): not known (no rank of host b answered within 2 s)");
  peers[3].image = made_log(3, 103, 'S', 1234);
  EXPECT_EQ(explain_timeout(id, "world", peers, 0),
            "; it is all_reduce #1234 of 25.0 MiB on world: every rank reached it");
}

// A two-level collective: rank 0 waits in the cross-host group [0, 2] for rank 2, which waits on its host for
// rank 3, stopped; rank 3's log came with host 2's answer and is named as the cause.
TEST(HangReport, NamesAStoppedRankOutsideTheGroup) {
  const CollectiveId id{0, 1234, Collective::all_gather, 4096};
  std::vector<PeerFacts> peers(2), others(1);
  peers[0] = {0, "a", made_log(0, 100, 'R', 1234), {}};
  peers[1] = {2, "b", made_log(2, 102, 'S', 1233), {}};
  others[0] = {3, "b", made_log(3, 103, 'T', 1233), {}};
  EXPECT_EQ(
      explain_timeout(id, "world", peers, 0, others),
      "; it is all_gather #1234 of 4.0 KiB on world: rank 2 never reached it; rank 2 (host b, pid 102) last "
      "did reduce_scatter #7 of 12.5 MiB on shard, started 31.2 s ago, state running (on world it started "
      "#1233, finished #1233); outside the group, rank 3 (host b, pid 103, stopped) last did reduce_scatter "
      "#7 of 12.5 MiB on shard, started 31.2 s ago, state running (on world it started #1233, finished "
      "#1233)");
}

TEST(HangReport, Bytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(4 << 20), "4.0 MiB");
  EXPECT_EQ(format_bytes(int64_t(3) << 30), "3.0 GiB");
}

}  // namespace
}  // namespace cz::dist
