// The JSON-lines log across restarts (Note [One log across resumes]) and the progress bar's ETA, on real
// files in a temporary folder.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "io/log/train_log.h"

namespace cz {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("cz_train_log_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

// A run from step 0 never overwrites a log: the old one is kept under the first free PATH.N, and said so.
TEST(JsonLog, AFreshRunKeepsAnExistingLog) {
  TempDir d;
  const fs::path log = d.path / "run.jsonl";
  {
    JsonLog l = JsonLog::start(log.string());
    EXPECT_EQ(l.note(), "");
    l.write({{"step", 1}, {"split", "train"}});
    l.write({{"step", 2}, {"split", "train"}, {"t", 5.0}});
  }
  const std::vector<std::string> first = lines_of(log);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_GT(nlohmann::json::parse(first[0]).at("t").get<double>(), 1.7e9);  // Unix seconds, added
  EXPECT_EQ(nlohmann::json::parse(first[1]).at("t").get<double>(), 5.0);    // kept when given
  {
    JsonLog l = JsonLog::start(log.string());
    EXPECT_EQ(l.note(), "--log " + log.string() +
                            ": the file held an earlier run's log (2 records, up to step 2); kept as " +
                            log.string() +
                            ".1, this run starts a new one (to continue that run, resume it "
                            "with --resume)");
    l.write({{"step", 1}});
  }
  EXPECT_EQ(lines_of(log.string() + ".1"), first);
  EXPECT_EQ(lines_of(log).size(), 1u);
  { JsonLog l = JsonLog::start(log.string()); }  // .1 is taken: .2
  EXPECT_TRUE(fs::exists(log.string() + ".2"));
  EXPECT_FALSE(fs::exists(log.string() + ".3"));
  // An empty file holds nothing to keep.
  EXPECT_EQ(JsonLog::start(log.string()).note(), "");
  EXPECT_FALSE(fs::exists(log.string() + ".3"));
}

// Resumed from step 5, the records of steps 6-8 that the stopped run logged past its checkpoint go, the rest
// (evaluations, the start record) stays byte for byte, and new records follow.
TEST(JsonLog, AResumedRunContinuesAfterTheCheckpointsStep) {
  TempDir d;
  const fs::path log = d.path / "run.jsonl";
  std::string text = R"({"event":"start","flags":{}})"
                     "\n";
  for (int s = 1; s <= 8; ++s) {
    text += nlohmann::json({{"step", s}, {"split", "train"}, {"loss", 1.0 / s}}).dump() + "\n";
    if (s % 4 == 0) text += nlohmann::json({{"step", s}, {"split", "eval"}}).dump() + "\n";
  }
  write_text(log, text + R"({"step":9,"spl)");  // cut short by a SIGKILL
  {
    JsonLog l = JsonLog::resume(log.string(), 5);
    EXPECT_EQ(l.note(),
              "--log " + log.string() +
                  ": continued after step 5; 4 record(s) of steps 6-8, logged past the checkpoint before "
                  "the run ended, dropped (they are run again); --log " +
                  log.string() + ": 1 line(s) that were not whole JSON objects dropped");
    l.write({{"step", 6}, {"split", "train"}});
  }
  const std::vector<std::string> lines = lines_of(log);
  ASSERT_EQ(lines.size(), 8u);  // start, steps 1-5, eval at 4, the new step 6
  std::vector<int64_t> steps;
  for (const std::string& line : lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("split", "") == "train") steps.push_back(j.at("step").get<int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(text_of(log).substr(0, text.find(R"({"loss":0.16666)")),
            text.substr(0, text.find(R"({"loss":0.16666)")));
  // Resuming where the log ends changes nothing and says nothing; a log that stops short says so.
  EXPECT_EQ(JsonLog::resume(log.string(), 6).note(), "");
  EXPECT_EQ(lines_of(log).size(), 8u);
  EXPECT_EQ(JsonLog::resume(log.string(), 9).note(),
            "--log " + log.string() +
                ": continued, but it ends at step 6: steps 7-9 of the checkpoint are not in it");
  // No file yet: a new one.
  const fs::path fresh = d.path / "fresh.jsonl";
  EXPECT_EQ(JsonLog::resume(fresh.string(), 5).note(), "");
  EXPECT_TRUE(fs::exists(fresh));
}

TEST(JsonLog, UnwritablePathsAreNamed) {
  try {
    JsonLog::start("/nonexistent_dir_cz/run.jsonl");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--log /nonexistent_dir_cz/run.jsonl: cannot open"),
              std::string::npos)
        << e.what();
  }
}

// The ETA counts the steps run since the bar started: resumed at 200 of 240, 10 steps in 10 s leave 30 s.
TEST(ProgressBar, EtaCountsOnlyThisProcesssSteps) {
  EXPECT_DOUBLE_EQ(eta_seconds(200, 210, 240, 10.0), 30.0);
  EXPECT_DOUBLE_EQ(eta_seconds(0, 10, 40, 10.0), 30.0);
  EXPECT_TRUE(std::isnan(eta_seconds(200, 200, 240, 1.0)));
  EXPECT_EQ(format_duration(eta_seconds(50, 51, 200, 0.12)), "0:18");
}

}  // namespace
}  // namespace cz
