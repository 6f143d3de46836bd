// The elastic supervisor's parts (src/dist/elastic): hostfiles, the batch split of a restart (Note [Same
// global batch at any size]), editing the relaunched command, the failure lines it acts on, its child
// processes, and its refusals of bad input. The restarts themselves run on the test bed:
// tests/hosts/run_elastic_tests.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error_of.h"
#include "dist/elastic/command.h"
#include "dist/elastic/hostfile.h"
#include "dist/elastic/process.h"
#include "dist/elastic/resize.h"
#include "dist/elastic/supervisor.h"
#include "tensor/check.h"

namespace cz::elastic {
namespace {

TEST(Hostfile, ParsesSlotsCommentsAndBlankLines) {
  const auto hosts =
      parse_hostfile_text("# the bed\n10.78.0.1 slots=2\n\n  h2   # one slot\nh3 slots=4\n", "hf");
  EXPECT_EQ(hosts, (std::vector<Host>{{"10.78.0.1", 2}, {"h2", 1}, {"h3", 4}}));
  EXPECT_EQ(total_slots(hosts), 7);
  const auto placed = place_ranks(hosts);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_EQ(placed[2].first_rank, 3);
  EXPECT_EQ(take_slots(hosts, 4), (std::vector<Host>{{"10.78.0.1", 2}, {"h2", 1}, {"h3", 1}}));
}

TEST(Hostfile, RefusesWhatItCannotPlace) {
  EXPECT_HAS(error_of<ValueError>([] { parse_hostfile_text("a slots=2\nb max_slots=3\n", "hf"); }),
             "hf line 2: expected 'HOST slots=N', found 'max_slots=3'");
  EXPECT_HAS(error_of<ValueError>([] { parse_hostfile_text("a slots=x\n", "hf"); }),
             "slots= needs a whole number, got 'x'");
  EXPECT_HAS(error_of<ValueError>([] { parse_hostfile_text("a slots=0\n", "hf"); }),
             "slots must be at least 1");
  EXPECT_HAS(error_of<ValueError>([] { parse_hostfile_text("a\nb\na\n", "hf"); }),
             "hf line 3: host a is listed twice");
  EXPECT_HAS(error_of<ValueError>([] { parse_hostfile_text("# nothing\n", "hf"); }), "hf: no host in it");
  EXPECT_HAS(error_of<IoError>([] { read_hostfile("/nonexistent/hosts"); }),
             "/nonexistent/hosts: cannot read");
}

// czrun inside a Slurm job: the allocation's nodes with SLURM_TASKS_PER_NODE's slots (tests/slurm runs it).
TEST(Hostfile, HostsOfASlurmAllocation) {
  const std::vector<std::string> nodes = {"n1", "n2", "n3", "n4"};
  EXPECT_EQ(hosts_of_allocation(nodes, "2(x3),1"),
            (std::vector<Host>{{"n1", 2}, {"n2", 2}, {"n3", 2}, {"n4", 1}}));
  EXPECT_EQ(hosts_of_allocation(nodes, "1,4(x2),3"),
            (std::vector<Host>{{"n1", 1}, {"n2", 4}, {"n3", 4}, {"n4", 3}}));
  EXPECT_EQ(hosts_of_allocation({"a", "b"}, ""), (std::vector<Host>{{"a", 1}, {"b", 1}}));
  EXPECT_THROW(hosts_of_allocation(nodes, "2(x2)"), ValueError);  // 2 counts for 4 nodes
  EXPECT_THROW(hosts_of_allocation(nodes, "2(x4"), ValueError);
  EXPECT_THROW(hosts_of_allocation(nodes, "0(x4)"), ValueError);
  EXPECT_THROW(slurm_hostnames("n[1-2]; rm -rf x"), ValueError);
}

TEST(Resize, KeepsTheGlobalBatch) {
  const BatchShape first{3, 4, 1};  // global batch 12
  // 2 ranks: 6 images each, at most 4 at a time: 3 x 2.
  EXPECT_EQ(resize(first, 2, 1), (BatchShape{2, 3, 2}));
  EXPECT_EQ(resize(first, 1, 1), (BatchShape{1, 4, 3}));
  EXPECT_EQ(resize(first, 3, 1), first);
  // 5 slots: 5 does not divide 12, 4 does.
  EXPECT_EQ(resize(first, 5, 1), (BatchShape{4, 3, 1}));
  EXPECT_EQ(resize(first, 2, 3), std::nullopt);                           // --min-ranks 3
  EXPECT_EQ(resize(BatchShape{2, 32, 2}, 3, 1), (BatchShape{2, 32, 2}));  // 128 over 3 ranks: no
  EXPECT_EQ(resize(BatchShape{7, 1, 1}, 6, 2), std::nullopt);             // 7 images: only 1 or 7 ranks
  EXPECT_EQ(describe(BatchShape{1, 4, 3}), "1 rank x micro-batch 4 x grad-accum 3 = global batch 12");
}

TEST(Command, ReadsAndReplacesFlagsInEitherSpelling) {
  const std::vector<std::string> cmd = {"app", "--micro-batch=8", "--steps", "40", "--micro-batch",
                                        "4",   "--log",           "l"};
  EXPECT_EQ(flag_value(cmd, "--micro-batch"), "4");
  EXPECT_EQ(flag_value(cmd, "--resume"), std::nullopt);
  EXPECT_EQ(with_flag(cmd, "--micro-batch", "3"),
            (std::vector<std::string>{"app", "--steps", "40", "--log", "l", "--micro-batch", "3"}));
  EXPECT_HAS(error_of<ValueError>([] {
               flag_value({"app", "--log"}, "--log");
             }),
             "ends with --log and no value");
  EXPECT_EQ(shell_words({"mpirun", "-np", "2", "a b", "it's"}), R"(mpirun -np 2 'a b' 'it'\''s')");
}

// Note [Resume command]: the launcher's words as typed, read off its command line when it ends with the
// rank's arguments; the resume command is that head, the arguments, and --resume DIR in place of any other.
TEST(Command, ResumeCommandKeepsTheLaunchersOptions) {
  const std::vector<std::string> args = {
      "build/apps/convnext_zero", "--steps", "90", "--resume=old", "--log", "a b.jsonl"};
  std::vector<std::string> mpirun = {
      "mpirun", "--allow-run-as-root", "--oversubscribe", "--hostfile", "h", "-np", "4"};
  mpirun.insert(mpirun.end(), args.begin(), args.end());
  const auto head = launcher_head(mpirun, args);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(
      resume_command(*head, args, "--resume", "ck"),
      "mpirun --allow-run-as-root --oversubscribe --hostfile h -np 4 build/apps/convnext_zero --steps 90 "
      "--log 'a b.jsonl' --resume ck");
  EXPECT_EQ(resume_command({args[0]}, args, "--resume", "ck"),
            "build/apps/convnext_zero --steps 90 --log 'a b.jsonl' --resume ck");
  // A parent whose command line does not end with the rank's arguments (orted, srun, a shell) says nothing.
  EXPECT_EQ(launcher_head({"orted", "-mca", "ess", "env"}, args), std::nullopt);
  EXPECT_EQ(launcher_head({"bash"}, args), std::nullopt);
  mpirun.back() = "b.jsonl";
  EXPECT_EQ(launcher_head(mpirun, args), std::nullopt);
}

TEST(Supervisor, ActsOnAbortsAndLostDaemons) {
  EXPECT_TRUE(
      is_failure_line("[rank 1] comm timeout: all_gather of 24 bytes on ranks [0, 1, 2] after 5.0 s "
                      "(waiting for rank 0); aborting"));
  EXPECT_TRUE(is_failure_line("ORTE has lost communication with a remote daemon."));
  EXPECT_TRUE(
      is_failure_line("mpirun noticed that process rank 2 with PID 5884 on node 10.78.0.3 exited on "
                      "signal 9 (Killed)."));
  EXPECT_FALSE(is_failure_line("step 12/40  loss 1.2340  2345 img/s"));
}

TEST(Supervisor, RefusesBadInput) {
  const std::string dir = ::testing::TempDir() + "/elastic_bad_input";
  std::filesystem::create_directories(dir);
  const std::string hostfile = dir + "/hosts";
  std::FILE* f = std::fopen(hostfile.c_str(), "w");
  std::fputs("localhost slots=2\n", f);
  std::fclose(f);
  SupervisorOptions o;
  o.hostfile = hostfile;
  o.command = {"convnext_zero", "--steps", "4"};
  EXPECT_HAS(error_of<ValueError>([&] { supervise(o); }), "the command needs --checkpoint-dir DIR");
  o.command = {"convnext_zero", "--checkpoint-dir", dir + "/ck", "--micro-batch", "four"};
  EXPECT_HAS(error_of<ValueError>([&] { supervise(o); }),
             "the command's --micro-batch must be a whole number");
  o.command = {"convnext_zero", "--checkpoint-dir", dir + "/ck"};
  o.min_ranks = 3;
  EXPECT_HAS(error_of<ValueError>([&] { supervise(o); }),
             "--min-ranks 3 must be between 1 and the hostfile's 2");
  o.hostfile = dir + "/missing";
  EXPECT_HAS(error_of<IoError>([&] { supervise(o); }), "missing: cannot read the hostfile");
}

TEST(Child, CopiesLinesAndReportsTheExitCode) {
  Child c({"sh", "-c", "echo one; echo two >&2; printf three; exit 3"}, Child::Output::kForward);
  std::vector<std::string> lines;
  while (!c.poll(50, [&](const std::string& l) { lines.push_back(l); })) {
  }
  c.finish(1000, [&](const std::string& l) { lines.push_back(l); });
  EXPECT_EQ(c.exit_code(), 3);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"one", "three", "two"}));
}

TEST(Child, RunAllKillsWhatOutlivesTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<bool> ok = run_all({{"true"}, {"false"}, {"sleep", "30"}, {"no-such-program-here"}}, 0.5);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ok, (std::vector<bool>{true, false, false, false}));
  EXPECT_LT(s, 5.0);
}

}  // namespace
}  // namespace cz::elastic
