// h5::File::append: datasets grown a batch at a time (--dump-batches) read back whole, in order, by our
// reader (and so by h5py); rows of another shape are refused with the file and key named.
#include <gtest/gtest.h>

#include "io/h5/h5_file.h"
#include "io_testing.h"

namespace cz {
namespace {

TEST(H5Append, RowsAccumulateInOrder) {
  testing::TempDir dir;
  const std::string path = dir.str("grow.h5");
  {
    h5::File f = h5::File::create(path);
    for (int call = 0; call < 3; ++call) {
      const int64_t rows = call + 1;  // chunks of the first call's size; later calls larger
      std::vector<float> v;
      for (int64_t i = 0; i < rows * 6; ++i) v.push_back(float(call * 100 + i));
      f.append("x", from_vector(v, {rows, 2, 3}));
      f.append("ids", from_vector(std::vector<int64_t>(size_t(rows), call), {rows}));
    }
    f.append("x", empty({0, 2, 3}, DType::f32));  // nothing to add
    f.commit();
  }
  const h5::File f = h5::File::open(path);
  const Tensor x = f.read("x");
  ASSERT_EQ(x.sizes(), (Shape{6, 2, 3}));
  const std::vector<float> xv = x.to_vector<float>();
  EXPECT_EQ(xv[0], 0.f);            // call 0, row 0
  EXPECT_EQ(xv[6], 100.f);          // call 1, row 0
  EXPECT_EQ(xv[6 * 3 + 5], 205.f);  // call 2, row 0, last element
  EXPECT_EQ(xv[35], 217.f);
  EXPECT_EQ(f.read("ids").to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 2, 2, 2}));
}

TEST(H5Append, RowsOfAnotherShapeAreRefused) {
  testing::TempDir dir;
  h5::File f = h5::File::create(dir.str("bad.h5"));
  f.append("x", zeros({2, 3}));
  try {
    f.append("x", zeros({2, 4}));
    ADD_FAILURE() << "rows of another shape were appended";
  } catch (const IoError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.h5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 4)"), std::string::npos) << msg;
  }
  EXPECT_THROW(f.append("y", from_vector(std::vector<int32_t>{1}, {1})), DtypeError);
}

}  // namespace
}  // namespace cz
