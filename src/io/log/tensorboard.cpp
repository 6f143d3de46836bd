// TensorBoard event files (Note [TensorBoard event files] in io/log/tensorboard.h): the record framing and
// CRC-32C written here, the Event messages by libprotobuf from io/log/tensorboard.proto.
#include "io/log/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "tensor/check.h"
#include "tensorboard.pb.h"

namespace cz {
namespace {

// The table of the reflected Castagnoli polynomial, byte at a time: the files hold a few hundred bytes per
// step, so speed does not matter.
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "host";
  return name;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, std::string_view flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  CZ_CHECK_IO(!ec, "{} {}: cannot create the folder: {}", flag, dir, ec.message());
  CZ_CHECK_IO(std::filesystem::is_directory(dir), "{} {}: not a folder", flag, dir);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{}.{}.{}", int64_t(now), host_name(), int64_t(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  CZ_CHECK_IO(file_ != nullptr, "{} {}: cannot create {}: {}", flag, dir, path_, std::strerror(errno));
  tb::Event first;
  first.set_wall_time(now);
  first.set_file_version("brain.Event:2");
  write_record(first.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write(int64_t step, std::span<const Scalar> scalars, double wall_time) {
  if (scalars.empty()) return;
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  tb::Summary* summary = e.mutable_summary();
  for (const Scalar& s : scalars) {
    tb::SummaryValue* v = summary->add_value();
    v->set_tag(s.tag);
    v->set_simple_value(float(s.value));
  }
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string header;
  put_le(header, data.size(), 8);
  std::string record = header;
  put_le(record, masked_crc32c(header), 4);
  record += data;
  put_le(record, masked_crc32c(data), 4);
  const bool ok =
      std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0;
  CZ_CHECK_IO(ok, "--tensorboard: cannot write {}: {}", path_, std::strerror(errno));
}

std::vector<TensorBoardWriter::Scalar> log_record_scalars(const nlohmann::json& record) {
  std::vector<TensorBoardWriter::Scalar> out;
  const auto split = record.find("split");
  if (split == record.end() || !split->is_string()) return out;
  const std::string prefix = split->get<std::string>() + "/";
  for (const auto& [key, value] : record.items()) {
    if (key == "step" || key == "epoch" || key == "stage" || key == "t" || key == "split") continue;
    if (!value.is_number()) continue;  // nulls, booleans (skipped), strings
    out.push_back({prefix + key, value.get<double>()});
  }
  const double comm = record.value("comm_s", 0.0);
  if (prefix == "train/" && comm > 0)
    out.push_back({"train/comm_hidden", std::max(0.0, 1 - record.value("comm_exposed_s", 0.0) / comm)});
  return out;
}

}  // namespace cz
