// File: data/indexed_dataset.h
//
// Reader and writer of Megatron's memory-mapped indexed dataset ("MMIDIDX"), the token format
// of megatron/core/datasets/indexed_dataset.py, byte for byte. A dataset is a pair of files
// sharing a prefix:
//
//   <prefix>.bin  the token arrays of all sequences, concatenated (little-endian, `dtype`)
//   <prefix>.idx  (all integers little-endian, no padding; offsets in bytes)
//        0  magic            9 bytes   "MMIDIDX\0\0"
//        9  version          u64       1
//       17  dtype code       u8        1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//                                      7 float32, 8 uint16
//       18  sequence count S u64
//       26  document count D u64       the length of the document-index array below, i.e.
//                                      number of documents + 1 (Megatron writes
//                                      len(document_indices) here)
//       34  lengths          i32[S]    tokens per sequence
//   34+4S   pointers         i64[S]    byte offset of each sequence in .bin
//   34+12S  document index   i64[D]    document j is sequences [idx[j], idx[j+1]); idx[0] = 0,
//                                      idx[D-1] = S; an empty document repeats an entry
//
// The arrays after the header are not naturally aligned (offset 34), so the reader loads them
// with memcpy, never through a cast pointer.
//
// Validation (every violation is kInvalidArgument naming the file and the field): magic,
// version 1, a known dtype code, the file size equal to 34 + 12S + 8D exactly (so a truncated
// or padded index, and Megatron's multimodal variant with its trailing i8[S] modes, are
// rejected), D >= 1, every length >= 0, every pointer >= 0, a multiple of the dtype size and
// with pointer + length * size <= size of .bin, and the document index starting at 0,
// non-decreasing and ending at S. Pointers need not be contiguous (Megatron's writer makes them
// so; its reader does not require it), and .bin may hold bytes no sequence refers to.
#ifndef SWITCHYARD_DATA_INDEXED_DATASET_H_
#define SWITCHYARD_DATA_INDEXED_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace switchyard {

// Megatron's DType codes (indexed_dataset.py `DType`).
enum class IndexedDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

// Bytes per element (1, 2, 4 or 8).
int64_t IndexedDTypeSize(IndexedDType dtype);
// NumPy's name: "uint8", "int8", ..., "uint16".
const char* IndexedDTypeName(IndexedDType dtype);
// True for the six integer dtypes.
bool IndexedDTypeIsInteger(IndexedDType dtype);

// The IndexedDType of C++ type T (compile error for other types).
template <typename T>
constexpr IndexedDType IndexedDTypeOf();

// A validated, memory-mapped dataset. Both files are mapped read-only (MAP_PRIVATE,
// PROT_READ); nothing is copied at Open (validation reads the index once).
// Lifetime: copies share the mappings; views from `Get`/`GetBytes` stay valid while any copy
// lives. Files must be replaced by rename (as IndexedDatasetWriter does), never rewritten in
// place: a file truncated while mapped makes reads of the lost pages fault.
// Thread-safety: all methods are const and may be called concurrently.
class IndexedDataset {
 public:
  // Maps and validates "<prefix>.idx" and "<prefix>.bin". kNotFound if either is missing,
  // kInvalidArgument for a malformed file (see the file comment), other codes for I/O errors.
  static absl::StatusOr<IndexedDataset> Open(const std::string& prefix);

  const std::string& prefix() const;
  IndexedDType dtype() const;
  int64_t num_sequences() const;
  // Number of documents (the document-count field minus one).
  int64_t num_documents() const;

  // Preconditions: 0 <= i < num_sequences() (checked with assert).
  int64_t SequenceLength(int64_t i) const;
  int64_t SequencePointer(int64_t i) const;
  // Precondition: 0 <= j <= num_documents(). Document j holds sequences
  // [DocumentIndex(j), DocumentIndex(j + 1)).
  int64_t DocumentIndex(int64_t j) const;
  // The whole document index (num_documents() + 1 entries), copied.
  std::vector<int64_t> DocumentIndices() const;

  // The bytes of sequence i. kOutOfRange if i is not in [0, num_sequences()).
  absl::StatusOr<absl::string_view> GetBytes(int64_t i) const;
  // The tokens of sequence i as a view into the mapping. kOutOfRange for a bad i,
  // kFailedPrecondition if T does not match dtype().
  template <typename T>
  absl::StatusOr<absl::Span<const T>> Get(int64_t i) const;
  // Copies tokens [offset, offset + out.size()) of sequence i into `out`, widening any integer
  // dtype to int32. kOutOfRange for a bad i or range, or a token that does not fit int32;
  // kFailedPrecondition for a float dtype.
  absl::Status ReadTokens(int64_t i, int64_t offset, absl::Span<int32_t> out) const;

 private:
  struct State;
  explicit IndexedDataset(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  const char* SequenceData(int64_t i) const;
  std::shared_ptr<const State> state_;
};

// Builds a dataset in memory, then writes both files (Megatron's IndexedDatasetBuilder).
// The .bin bytes are held in memory until Finalize: fine for test data and shards of a few GB;
// a streaming variant is future work. Not thread-safe.
class IndexedDatasetWriter {
 public:
  explicit IndexedDatasetWriter(IndexedDType dtype);

  // Appends one sequence to the current document, converting to the integer dtype.
  // kFailedPrecondition for a float dtype (use AddRaw); kOutOfRange if a token does not fit the
  // dtype or the sequence has more than INT32_MAX tokens. Nothing is added on error.
  absl::Status Add(absl::Span<const int64_t> tokens);
  // Appends one sequence of `count` elements of dtype() read from `data` (any dtype).
  // kOutOfRange if count is negative or above INT32_MAX.
  absl::Status AddRaw(const void* data, int64_t count);
  // Ends the current document. Without a preceding Add it records an empty document, as
  // Megatron's end_document does.
  void EndDocument();

  // Writes "<prefix>.bin" then "<prefix>.idx", each atomically (to "<file>.tmp.<pid>", fsync,
  // rename, fsync of the directory). Sequences added since the last EndDocument form a final
  // document (the writer's state is not changed). May be called again after more Adds. On error
  // no temporary file is left behind; a failure after the .bin rename leaves the new .bin next
  // to the old .idx, so readers should open a dataset only once its writer has reported success.
  absl::Status Finalize(const std::string& prefix) const;

  IndexedDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }

  // The index file's bytes for the current state (what Finalize writes to .idx).
  std::string IndexBytes() const;

 private:
  IndexedDType dtype_;
  std::string bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_indices_{0};
};

// ---------------------------------------------------------------------------------------------
// Implementation details of the templates.

template <typename T>
constexpr IndexedDType IndexedDTypeOf() {
  if constexpr (std::is_same_v<T, uint8_t>) return IndexedDType::kUInt8;
  if constexpr (std::is_same_v<T, int8_t>) return IndexedDType::kInt8;
  if constexpr (std::is_same_v<T, int16_t>) return IndexedDType::kInt16;
  if constexpr (std::is_same_v<T, int32_t>) return IndexedDType::kInt32;
  if constexpr (std::is_same_v<T, int64_t>) return IndexedDType::kInt64;
  if constexpr (std::is_same_v<T, double>) return IndexedDType::kFloat64;
  if constexpr (std::is_same_v<T, float>) return IndexedDType::kFloat32;
  if constexpr (std::is_same_v<T, uint16_t>) return IndexedDType::kUInt16;
  static_assert(std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t> ||
                    std::is_same_v<T, int16_t> || std::is_same_v<T, int32_t> ||
                    std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                    std::is_same_v<T, float> || std::is_same_v<T, uint16_t>,
                "T has no Megatron dtype code");
  return IndexedDType::kUInt8;
}

template <typename T>
absl::StatusOr<absl::Span<const T>> IndexedDataset::Get(int64_t i) const {
  if (IndexedDTypeOf<T>() != dtype()) {
    return absl::FailedPreconditionError(std::string(prefix()) + ": Get<" +
                                         IndexedDTypeName(IndexedDTypeOf<T>()) +
                                         "> on a dataset of dtype " + IndexedDTypeName(dtype()));
  }
  absl::StatusOr<absl::string_view> bytes = GetBytes(i);
  if (!bytes.ok()) return bytes.status();
  // Open checked that every pointer is a multiple of sizeof(T); the mapping is page-aligned.
  return absl::Span<const T>(reinterpret_cast<const T*>(bytes->data()), bytes->size() / sizeof(T));
}

}  // namespace switchyard

#endif  // SWITCHYARD_DATA_INDEXED_DATASET_H_
