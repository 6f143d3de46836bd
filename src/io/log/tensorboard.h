// --tensorboard DIR: the run's scalars as a TensorBoard event file, which TensorBoard (and tools that import
// its files, such as Weights & Biases) reads as it reads PyTorch's SummaryWriter's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cz {

// Note [TensorBoard event files]: a file named events.out.tfevents.<unix seconds>.<host>.<pid> (TensorBoard
// reads every file whose name holds "tfevents") is a sequence of records, each
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | length bytes of data | uint32 masked CRC-32C of
//   the data
// (little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8, TensorFlow's record format), and each
// record's data is an Event message serialised by libprotobuf from io/log/tensorboard.proto, whose field
// numbers are TensorBoard's. The first event holds file_version "brain.Event:2"; each later one a step's
// scalars as Summary values with simple_value. Every start of a run (a resume too) opens a new file in DIR;
// TensorBoard reads the files of a folder in name order as one run. Records are flushed as they are written,
// so a crash loses at most the one being written and TensorBoard can watch the run live.
class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it; IoError naming `flag`, the folder and the reason.
  TensorBoardWriter(const std::string& dir, std::string_view flag = "--tensorboard");
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  struct Scalar {
    std::string tag;
    double value;
  };
  // One event at `step` holding every scalar (stored as float, as TensorBoard's simple_value is).
  void write(int64_t step, std::span<const Scalar> scalars, double wall_time);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::FILE* file_ = nullptr;
  std::string path_;
};

// The scalars of one record of the JSON log (io/log/train_log.h), tagged "<split>/<key>": every number of a
// "train" or "eval" record except its step, epoch, stage and time, so that TensorBoard shows what the log
// holds under the log's own names; a train record with communication also gets "train/comm_hidden"
// (1 - comm_exposed_s / comm_s, the closing line's "hidden"). Nulls (top-5 under 5 classes) are left out;
// other records (start, restart events) give none.
std::vector<TensorBoardWriter::Scalar> log_record_scalars(const nlohmann::json& record);

// CRC-32C (Castagnoli) of `data`, and TensorFlow's masked form of it: exposed for the tests.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

}  // namespace cz
