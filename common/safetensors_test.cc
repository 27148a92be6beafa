// Safetensors reader/writer: round trips of every dtype, a file laid out by hand, the fixture
// written by the reference Python package (read it, and reproduce it byte for byte), malformed
// files (hand-made cases, every truncation, random mutations), writer errors and ConvertTensor.
#include "common/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace switchyard {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file image laid out by hand: 8-byte little-endian header length, header, data.
std::string Image(const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + data;
}

template <typename T>
std::string Bytes(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return out;
}

std::string TensorBytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data), t.bytes());
}

#define EXPECT_STATUS(expr, code_, substr)                                    \
  do {                                                                        \
    const absl::Status s_ = (expr);                                           \
    EXPECT_EQ(s_.code(), (code_)) << s_;                                      \
    EXPECT_NE(s_.message().find(substr), absl::string_view::npos)             \
        << "message \"" << s_.message() << "\" lacks \"" << (substr) << "\""; \
  } while (0)

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                                DType::kI32, DType::kI64, DType::kU8,   DType::kBool};

TEST(SafetensorsTest, RoundTripsEveryDTypeWithEmptyAndScalarTensorsAndMetadata) {
  struct Case {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint64_t> storage;  // 8-byte aligned
  };
  std::vector<Case> cases;
  int seed = 1;
  for (DType dt : kAllDTypes) {
    for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 5}, std::vector<int64_t>{},
                                       std::vector<int64_t>{0, 4}, std::vector<int64_t>{7}}) {
      Case c{std::string(DTypeName(dt)) + "/" + std::to_string(shape.size()) + "d" +
                 std::to_string(shape.empty() ? 1 : shape[0]),
             dt,
             shape,
             {}};
      Tensor t(dt, shape, Device::Cpu(), nullptr);
      c.storage.resize((t.bytes() + 7) / 8 + 1);
      auto* p = reinterpret_cast<uint8_t*>(c.storage.data());
      for (size_t i = 0; i < t.bytes(); ++i) {
        p[i] = dt == DType::kBool ? (i * 7 + seed) % 2 : static_cast<uint8_t>(i * 37 + seed * 11);
      }
      ++seed;
      cases.push_back(std::move(c));
    }
  }
  SafetensorsWriter writer;
  for (const Case& c : cases) {
    writer.Add(c.name,
               Tensor(c.dtype, c.shape, Device::Cpu(), const_cast<uint64_t*>(c.storage.data())));
  }
  writer.SetMetadata("format", "pt");
  writer.SetMetadata("note", "quote \" backslash \\ newline \n unicode \xc3\xa9");
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(writer.Write(path).ok());
  EXPECT_FALSE(FileExists(path + ".tmp." + std::to_string(getpid())));

  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().size(), 2u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "quote \" backslash \\ newline \n unicode \xc3\xa9");
  EXPECT_EQ(file->Names().size(), cases.size());
  for (const Case& c : cases) {
    ASSERT_TRUE(file->Has(c.name)) << c.name;
    absl::StatusOr<Tensor> t = file->Get(c.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, c.dtype) << c.name;
    EXPECT_EQ(t->shape, c.shape) << c.name;
    EXPECT_FALSE(t->device.is_cuda());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % DTypeSize(c.dtype), 0u) << c.name;
    EXPECT_EQ(TensorBytes(*t),
              std::string(reinterpret_cast<const char*>(c.storage.data()), t->bytes()))
        << c.name;
  }
  // ToBytes is the same image, and FromBytes reads it.
  absl::StatusOr<std::string> bytes = writer.ToBytes();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, ReadFile(path));
  absl::StatusOr<SafetensorsFile> in_memory = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  EXPECT_EQ(in_memory->Names(), file->Names());
  std::printf("round trip: %zu tensors, 8 dtypes, %zu-byte file\n", cases.size(), bytes->size());
}

TEST(SafetensorsTest, EmptyWriterMatchesReferenceBytes) {
  // The reference's serialize({}) is [8, 0 x7, '{', '}', ' ' x6].
  absl::StatusOr<std::string> bytes = SafetensorsWriter().ToBytes();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, Image("{}      ", ""));
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->Names().empty());
  EXPECT_TRUE(file->metadata().empty());
}

TEST(SafetensorsTest, ReadsFileLaidOutByHand) {
  // Header of 54 bytes, not padded: the F32 data lands at file offset 62, misaligned, so the
  // reader must hand out an aligned copy.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string bytes = Image(header, Bytes<float>({1.5f, -2.0f}));
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const std::string path = TempPath("by_hand.safetensors");
  WriteFile(path, bytes);
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->Names(), std::vector<std::string>{"a"});
  absl::StatusOr<Tensor> a = file->Get("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->DebugString(), "f32[2]@cpu");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);
  EXPECT_EQ(a->as<float>()[0], 1.5f);
  EXPECT_EQ(a->as<float>()[1], -2.0f);

  // Padded header, entries out of name order, 0-d and empty tensors, metadata, extra keys.
  const std::string header2 =
      R"({"z":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[0,3],"data_offsets":[8,8],"extra":1},)"
      R"("c":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("__metadata__":{"k":"v"}}    )";
  const std::string data2 =
      Bytes<int64_t>({-42}) + Bytes<uint16_t>({BF16::FromFloat(0.5f).bits, 0xc040});
  absl::StatusOr<SafetensorsFile> file2 = SafetensorsFile::FromBytes(Image(header2, data2));
  ASSERT_TRUE(file2.ok()) << file2.status();
  EXPECT_EQ(file2->Names(), (std::vector<std::string>{"b", "c", "z"}));
  EXPECT_EQ(file2->metadata().at("k"), "v");
  EXPECT_EQ(file2->Get("z")->rank(), 0);
  EXPECT_EQ(file2->Get("z")->as<int64_t>()[0], -42);
  EXPECT_EQ(file2->Get("b")->numel(), 0);
  EXPECT_EQ(file2->Get("c")->as<BF16>()[0].ToFloat(), 0.5f);
  EXPECT_EQ(file2->Get("c")->as<BF16>()[1].ToFloat(), -3.0f);
}

TEST(SafetensorsTest, ViewsOutliveMovesAndCopiesOfTheFile) {
  absl::StatusOr<Tensor> t;
  {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(
        Image(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", Bytes<int32_t>({9})));
    ASSERT_TRUE(file.ok());
    SafetensorsFile copy = *file;
    SafetensorsFile moved = std::move(*file);
    t = copy.Get("a");
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(moved.Get("a")->data, t->data);
    EXPECT_EQ(t->as<int32_t>()[0], 9);
  }
}

TEST(SafetensorsTest, UnsupportedDTypeOpensButGetIsUnimplemented) {
  const std::string header = R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},)"
                             R"("s":{"dtype":"F4","shape":[4],"data_offsets":[4,6]}})";
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::FromBytes(Image(header, std::string(6, '\x01')), "q.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->Names(), (std::vector<std::string>{"q", "s"}));
  EXPECT_STATUS(file->Get("q").status(), absl::StatusCode::kUnimplemented, "I8");
  EXPECT_STATUS(file->Get("s").status(), absl::StatusCode::kUnimplemented, "F4");
  EXPECT_STATUS(file->Get("missing").status(), absl::StatusCode::kNotFound, "q.safetensors");
}

// The fixture was written by common/testdata/make_safetensors_fixture.py with the reference
// package; the values here are the ones that script writes.
TEST(SafetensorsTest, ReadsAndReproducesReferenceFixture) {
  const std::string path = "common/testdata/interop.safetensors";
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->Names(), (std::vector<std::string>{"bf16", "bool", "empty", "f16", "f32",
                                                     "f64_scalar", "i32", "i64", "u8"}));
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  auto get = [&](const char* name, DType dtype, std::vector<int64_t> shape) {
    absl::StatusOr<Tensor> t = file->Get(name);
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->dtype, dtype) << name;
    EXPECT_EQ(t->shape, shape) << name;
    return *t;
  };
  const Tensor f32 = get("f32", DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f32.as<float>()[i], i * 0.5f - 1.0f);
  EXPECT_EQ(get("f64_scalar", DType::kF64, {}).as<double>()[0], 3.25);
  const Tensor bf16 = get("bf16", DType::kBF16, {2, 2});
  const float bf16_want[] = {1.0f, -2.5f, 0.15625f, 1024.0f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16.as<BF16>()[i].ToFloat(), bf16_want[i]);
  const Tensor f16 = get("f16", DType::kF16, {3});
  const uint16_t f16_want[] = {0x3800, 0xbc00, 0x7bff};  // 0.5, -1, 65504
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f16.as<uint16_t>()[i], f16_want[i]);
  const Tensor i32 = get("i32", DType::kI32, {2, 2});
  const int32_t i32_want[] = {-7, 0, 2147483647, -2147483647 - 1};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(i32.as<int32_t>()[i], i32_want[i]);
  const Tensor i64 = get("i64", DType::kI64, {2});
  EXPECT_EQ(i64.as<int64_t>()[0], -(int64_t{1} << 40));
  EXPECT_EQ(i64.as<int64_t>()[1], 5);
  EXPECT_EQ(TensorBytes(get("u8", DType::kU8, {3})), std::string("\x00\x01\xff", 3));
  EXPECT_EQ(TensorBytes(get("bool", DType::kBool, {3})), std::string("\x01\x00\x01", 3));
  EXPECT_EQ(get("empty", DType::kF32, {0, 3}).numel(), 0);

  // Our writer, given the same tensors in another order, writes the same bytes.
  SafetensorsWriter writer;
  std::vector<std::string> names = file->Names();
  std::reverse(names.begin(), names.end());
  for (const std::string& name : names) writer.Add(name, *file->Get(name));
  writer.SetMetadata("format", "pt");
  absl::StatusOr<std::string> bytes = writer.ToBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string reference = ReadFile(path);
  EXPECT_EQ(*bytes, reference);
  std::printf("reference fixture: %zu tensors, %zu bytes, writer output identical: %s\n",
              names.size(), reference.size(), *bytes == reference ? "yes" : "NO");
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = TempPath("does_not_exist.safetensors");
  EXPECT_STATUS(SafetensorsFile::Open(path).status(), absl::StatusCode::kNotFound, path);
}

TEST(SafetensorsTest, MalformedFilesAreInvalidArgumentNamingFileAndProblem) {
  const std::string f32x2 = Bytes<float>({1.0f, 2.0f});
  auto entry = [](const std::string& name, const std::string& body) {
    return "\"" + name + "\":{" + body + "}";
  };
  struct Case {
    const char* what;
    std::string bytes;
    const char* problem;
  };
  std::string huge_n(8, '\0');
  huge_n[3] = 0x10;  // 2^28 > the 1e8 limit
  const std::string overflow_shape =
      "{" + entry("a", R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])") +
      "}";
  const Case cases[] = {
      {"empty file", "", "fewer than the 8-byte"},
      {"short file", "\x02\x00\x00", "fewer than the 8-byte"},
      {"header longer than file", Image("{}", "").substr(0, 9), "larger than the 1 bytes"},
      {"header over limit", huge_n + "{}", "exceeds the limit"},
      {"invalid json", Image("{\"a\":", ""), "not valid JSON"},
      {"trailing garbage", Image("{}x", ""), "not valid JSON"},
      {"nul padding", Image(std::string("{}\0", 3), ""), "not valid JSON"},
      {"invalid utf-8", Image("{\"\xff\":{}}", ""), "not valid JSON"},
      {"not an object", Image("[1,2]", ""), "not a JSON object"},
      {"entry not an object", Image("{\"a\":3}", ""), "entry is not a JSON object"},
      {"missing dtype", Image("{" + entry("a", R"("shape":[2],"data_offsets":[0,8])") + "}", f32x2),
       "needs \"dtype\""},
      {"unknown dtype",
       Image("{" + entry("a", R"("dtype":"F33","shape":[2],"data_offsets":[0,8])") + "}", f32x2),
       "unknown dtype \"F33\""},
      {"dtype not a string",
       Image("{" + entry("a", R"("dtype":1,"shape":[2],"data_offsets":[0,8])") + "}", f32x2),
       "dtype is not a string"},
      {"negative dim",
       Image("{" + entry("a", R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])") + "}", f32x2),
       "negative dim -2"},
      {"float dim",
       Image("{" + entry("a", R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])") + "}", f32x2),
       "non-integer"},
      {"shape not array",
       Image("{" + entry("a", R"("dtype":"F32","shape":2,"data_offsets":[0,8])") + "}", f32x2),
       "shape is not an array"},
      {"shape overflow", Image(overflow_shape, f32x2), "overflows"},
      {"offsets arity",
       Image("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8,9])") + "}", f32x2),
       "not a pair"},
      {"negative offset",
       Image("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[-1,7])") + "}", f32x2),
       "not a pair"},
      {"begin after end",
       Image("{" + entry("a", R"("dtype":"F32","shape":[0],"data_offsets":[8,0])") + "}", f32x2),
       "begin > end"},
      {"size mismatch",
       Image("{" + entry("a", R"("dtype":"F32","shape":[3],"data_offsets":[0,8])") + "}", f32x2),
       "span 8 bytes but \"F32\" [3] needs 12"},
      {"out of range",
       Image("{" + entry("a", R"("dtype":"F32","shape":[4],"data_offsets":[0,16])") + "}", f32x2),
       "out of range of the 8-byte data buffer"},
      {"overlap",
       Image("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                 entry("b", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") + "}",
             f32x2),
       "overlaps tensor"},
      {"gap",
       Image("{" + entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") + "}", f32x2),
       "gap in the data buffer"},
      {"trailing bytes",
       Image("{" + entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4])") + "}", f32x2),
       "has 8 bytes but the tensors cover 4"},
      {"duplicate names",
       Image("{" + entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4])") + "," +
                 entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") + "}",
             f32x2),
       "duplicate key \"a\""},
      {"duplicate field",
       Image("{" + entry("a", R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])") +
                 "}",
             f32x2),
       "duplicate key \"dtype\""},
      {"metadata not object", Image(R"({"__metadata__":[1]})", ""), "__metadata__ is not"},
      {"metadata value not string", Image(R"({"__metadata__":{"k":1}})", ""), "not a string"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_STATUS(SafetensorsFile::FromBytes(c.bytes, "bad.safetensors").status(),
                  absl::StatusCode::kInvalidArgument, "bad.safetensors: ");
    EXPECT_STATUS(SafetensorsFile::FromBytes(c.bytes).status(), absl::StatusCode::kInvalidArgument,
                  c.problem);
  }
  // Through Open too: the message names the path.
  const std::string path = TempPath("bad.safetensors");
  WriteFile(path, cases[4].bytes);
  EXPECT_STATUS(SafetensorsFile::Open(path).status(), absl::StatusCode::kInvalidArgument,
                path + ": header is not valid JSON");
  // A FIFO is rejected without blocking.
  const std::string fifo = TempPath("fifo.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_STATUS(SafetensorsFile::Open(fifo).status(), absl::StatusCode::kInvalidArgument,
                "not a regular file");
  // A directory is not a safetensors file.
  EXPECT_STATUS(
      SafetensorsFile::Open(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp")
          .status(),
      absl::StatusCode::kInvalidArgument, "not a regular file");
}

// A valid image with several dtypes, metadata and a 0-d tensor, to truncate and mutate.
std::string ValidImage() {
  static const std::vector<float> f = {1, 2, 3, 4, 5, 6};
  static const std::vector<double> d = {7.5};
  static const std::vector<uint16_t> h = {1, 2, 3};
  SafetensorsWriter w;
  w.Add("layer.0.weight", Tensor(DType::kF32, {2, 3}, Device::Cpu(), const_cast<float*>(f.data())));
  w.Add("scale", Tensor(DType::kF64, {}, Device::Cpu(), const_cast<double*>(d.data())));
  w.Add("bias", Tensor(DType::kBF16, {3}, Device::Cpu(), const_cast<uint16_t*>(h.data())));
  w.SetMetadata("format", "pt");
  return *w.ToBytes();
}

// Reads every byte of every tensor of a file that opened, so that a bad view would fault.
uint64_t TouchAll(const SafetensorsFile& file) {
  uint64_t sum = 0;
  for (const std::string& name : file.Names()) {
    absl::StatusOr<Tensor> t = file.Get(name);
    if (!t.ok()) continue;
    for (char c : TensorBytes(*t)) sum += static_cast<unsigned char>(c);
  }
  return sum;
}

TEST(SafetensorsTest, EveryTruncationIsInvalidArgument) {
  const std::string image = ValidImage();
  ASSERT_TRUE(SafetensorsFile::FromBytes(image).ok());
  for (size_t len = 0; len < image.size(); ++len) {
    absl::Status s = SafetensorsFile::FromBytes(image.substr(0, len)).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "length " << len << ": " << s;
  }
  // Through files, at a few lengths (inside the length, the header and the data).
  const std::string path = TempPath("truncated.safetensors");
  for (size_t len : {size_t{0}, size_t{5}, size_t{8}, size_t{40}, image.size() - 1}) {
    WriteFile(path, image.substr(0, len));
    EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kInvalidArgument)
        << len;
  }
  std::printf("truncations: %zu lengths, all rejected\n", image.size());
}

TEST(SafetensorsTest, RandomMutationsNeverCrash) {
  const std::string image = ValidImage();
  const uint64_t seed = std::random_device{}();
  std::printf("mutation seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int opened = 0, rejected = 0;
  const int kIterations = 20000;
  for (int it = 0; it < kIterations; ++it) {
    std::string bytes = image;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t pos = rng() % bytes.size();
      switch (rng() % 4) {
        case 0:
          bytes[pos] = static_cast<char>(rng());
          break;  // random byte
        case 1:
          bytes[pos] ^= static_cast<char>(1 << (rng() % 8));
          break;  // bit flip
        case 2:
          bytes[pos] = "{}[]\",:0-9e.\\ "[rng() % 15];
          break;  // JSON syntax
        default:
          bytes.erase(pos, 1 + rng() % 8);
          break;  // deletion
      }
      if (bytes.empty()) break;
    }
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(bytes);
    if (file.ok()) {
      ++opened;
      TouchAll(*file);
    } else {
      ++rejected;
      ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    }
  }
  std::printf("mutations: %d images, %d still valid, %d rejected with kInvalidArgument\n",
              kIterations, opened, rejected);
}

TEST(SafetensorsTest, WriterRecordsAddErrorsAndWritesNothing) {
  float x[2] = {1, 2};
  const Tensor ok(DType::kF32, {2}, Device::Cpu(), x);
  struct Case {
    const char* what;
    std::string name;
    Tensor tensor;
    const char* problem;
  };
  const Case cases[] = {
      {"reserved name", "__metadata__", ok, "reserved"},
      {"duplicate", "a", ok, "duplicate name"},
      {"cuda", "g", Tensor(DType::kF32, {2}, Device::Cuda(0), x), "not a CPU tensor"},
      {"negative dim", "n", Tensor(DType::kF32, {-2}, Device::Cpu(), x), "negative dim"},
      {"null data", "z", Tensor(DType::kF32, {2}, Device::Cpu(), nullptr), "null data"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    SafetensorsWriter writer;
    writer.Add("a", ok);
    writer.Add(c.name, c.tensor);
    const std::string path = TempPath("rejected.safetensors");
    EXPECT_STATUS(writer.Write(path), absl::StatusCode::kInvalidArgument, c.problem);
    EXPECT_FALSE(FileExists(path));
    EXPECT_EQ(writer.ToBytes().status().code(), absl::StatusCode::kInvalidArgument);
  }
  SafetensorsWriter bad_utf8;
  bad_utf8.Add("\xff", ok);
  EXPECT_STATUS(bad_utf8.ToBytes().status(), absl::StatusCode::kInvalidArgument, "UTF-8");
}

TEST(SafetensorsTest, WriteIsAtomicAndReportsIoErrors) {
  float x[2] = {1, 2};
  SafetensorsWriter writer;
  writer.Add("a", Tensor(DType::kF32, {2}, Device::Cpu(), x));
  const std::string missing_dir = TempPath("no_such_dir/out.safetensors");
  EXPECT_STATUS(writer.Write(missing_dir), absl::StatusCode::kNotFound, "no_such_dir");
  // Overwriting an existing file replaces it whole.
  const std::string path = TempPath("overwrite.safetensors");
  WriteFile(path, "old contents");
  ASSERT_TRUE(writer.Write(path).ok());
  EXPECT_EQ(ReadFile(path), *writer.ToBytes());
  EXPECT_FALSE(FileExists(path + ".tmp." + std::to_string(getpid())));
  // A relative path (the directory fsync uses ".").
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(chdir(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"), 0);
  const absl::Status relative = writer.Write("relative.safetensors");
  ASSERT_EQ(chdir(cwd), 0);
  EXPECT_TRUE(relative.ok()) << relative;
}

TEST(ConvertTensorTest, ConvertsAmongF32F64Bf16AndCopiesEqualDTypes) {
  const std::vector<float> f = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f, 1.00390625f};
  std::vector<BF16> b(f.size());
  std::vector<double> d(f.size());
  std::vector<float> back(f.size());
  const std::vector<int64_t> shape = {2, 3};
  auto t = [&](DType dt, void* p) { return Tensor(dt, shape, Device::Cpu(), p); };
  ASSERT_TRUE(
      ConvertTensor(t(DType::kF32, const_cast<float*>(f.data())), t(DType::kBF16, b.data())).ok());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(b[i].bits, BF16::FromFloat(f[i]).bits) << i;
  ASSERT_TRUE(ConvertTensor(t(DType::kBF16, b.data()), t(DType::kF64, d.data())).ok());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(d[i], double(b[i].ToFloat())) << i;
  ASSERT_TRUE(ConvertTensor(t(DType::kF64, d.data()), t(DType::kF32, back.data())).ok());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(back[i], b[i].ToFloat()) << i;
  // f64 -> bf16 and f64 -> f32 round to nearest even.
  std::vector<double> d2 = {1.0 + 1.0 / 256, 1.0 + 3.0 / 256, -1e300, 0.1, NAN, 1.0 + 1e-12};
  ASSERT_TRUE(ConvertTensor(t(DType::kF64, d2.data()), t(DType::kBF16, b.data())).ok());
  EXPECT_EQ(b[0].ToFloat(), 1.0f);               // tie -> even
  EXPECT_EQ(b[1].ToFloat(), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_TRUE(std::isinf(b[2].ToFloat()) && b[2].ToFloat() < 0);
  EXPECT_EQ(b[3].bits, BF16::FromFloat(0.1f).bits);
  EXPECT_TRUE(std::isnan(b[4].ToFloat()));
  ASSERT_TRUE(ConvertTensor(t(DType::kF64, d2.data()), t(DType::kF32, back.data())).ok());
  EXPECT_EQ(back[3], 0.1f);
  EXPECT_EQ(back[5], 1.0f);
  // Equal dtypes copy bytes, whatever the dtype.
  int32_t i32[6] = {1, -2, 3, -4, 5, -6}, i32_out[6] = {};
  ASSERT_TRUE(ConvertTensor(t(DType::kI32, i32), t(DType::kI32, i32_out)).ok());
  EXPECT_EQ(std::memcmp(i32, i32_out, sizeof(i32)), 0);
}

TEST(ConvertTensorTest, RejectsBadArguments) {
  float f[6];
  double d[6];
  int32_t i[6];
  const Tensor f23(DType::kF32, {2, 3}, Device::Cpu(), f);
  EXPECT_STATUS(ConvertTensor(f23, Tensor(DType::kF64, {3, 2}, Device::Cpu(), d)),
                absl::StatusCode::kInvalidArgument, "shapes differ");
  EXPECT_STATUS(ConvertTensor(f23, Tensor(DType::kF64, {2, 3}, Device::Cuda(0), d)),
                absl::StatusCode::kInvalidArgument, "CPU");
  EXPECT_STATUS(ConvertTensor(f23, Tensor(DType::kF64, {2, 3}, Device::Cpu(), nullptr)),
                absl::StatusCode::kInvalidArgument, "null data");
  EXPECT_STATUS(ConvertTensor(f23, Tensor(DType::kI32, {2, 3}, Device::Cpu(), i)),
                absl::StatusCode::kUnimplemented, "only f32, f64 and bf16");
  EXPECT_TRUE(ConvertTensor(Tensor(DType::kF32, {0, 3}, Device::Cpu(), nullptr),
                            Tensor(DType::kBF16, {0, 3}, Device::Cpu(), nullptr))
                  .ok());
}

}  // namespace
}  // namespace switchyard
