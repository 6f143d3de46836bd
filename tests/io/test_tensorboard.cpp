// --tensorboard's pieces: CRC-32C against its published check value, the record framing of a real file, and
// which of a log record's values become scalars. The whole path (a run's file read by TensorBoard) is
// tests/dist/train/run_observe_tests.sh's.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include "io/log/tensorboard.h"
#include "tensor/check.h"

namespace cz {
namespace {

TEST(TensorBoard, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c(""), 0u);
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, FileIsFramedRecords) {
  const auto dir = std::filesystem::temp_directory_path() / ("cz_tb_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter w(dir.string());
    path = w.path();
    const TensorBoardWriter::Scalar s[] = {{"train/loss", 1.5}, {"train/lr", 0.001}, {"train/zero", 0.0}};
    w.write(7, s, 1.7e9);
  }
  EXPECT_NE(path.find("events.out.tfevents."), std::string::npos);
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0, records = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    uint64_t len = 0;
    uint32_t hcrc = 0, dcrc = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&hcrc, bytes.data() + at + 8, 4);
    EXPECT_EQ(hcrc, masked_crc32c(std::string_view(bytes).substr(at, 8)));
    ASSERT_LE(at + 16 + len, bytes.size());
    std::memcpy(&dcrc, bytes.data() + at + 12 + len, 4);
    EXPECT_EQ(dcrc, masked_crc32c(std::string_view(bytes).substr(at + 12, len)));
    at += 16 + len;
    ++records;
  }
  EXPECT_EQ(at, bytes.size());
  EXPECT_EQ(records, 2u);  // the file version, then the step
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
  // A 0 is in the bytes (field 2, fixed32, zero), not left out as a plain proto3 field's would be:
  // TensorBoard drops a value that has none.
  EXPECT_NE(bytes.find(std::string("train/zero\x15\0\0\0\0", 15)), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(TensorBoard, ScalarsOfLogRecords) {
  const auto train = log_record_scalars({{"split", "train"},
                                         {"step", 3},
                                         {"epoch", 0},
                                         {"loss", 2.0},
                                         {"skipped", false},
                                         {"comm_s", 0.2},
                                         {"comm_exposed_s", 0.05}});
  ASSERT_EQ(train.size(), 4u);  // loss, comm_s, comm_exposed_s, comm_hidden: not step, epoch or the bool
  EXPECT_EQ(train.back().tag, "train/comm_hidden");
  EXPECT_DOUBLE_EQ(train.back().value, 0.75);
  const auto eval = log_record_scalars({{"split", "eval"}, {"step", 3}, {"top1", 0.5}, {"top5", nullptr}});
  ASSERT_EQ(eval.size(), 1u);
  EXPECT_EQ(eval[0].tag, "eval/top1");
  EXPECT_TRUE(log_record_scalars({{"event", "start"}}).empty());
}

TEST(TensorBoard, UnwritableFolderNamesFlagAndPath) {
  EXPECT_THROW(
      {
        try {
          TensorBoardWriter w("/proc/cz_no_such_dir", "--tensorboard");
        } catch (const IoError& e) {
          EXPECT_NE(std::string(e.what()).find("--tensorboard /proc/cz_no_such_dir"), std::string::npos)
              << e.what();
          throw;
        }
      },
      IoError);
}

}  // namespace
}  // namespace cz
