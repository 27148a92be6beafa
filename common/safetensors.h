// File: common/safetensors.h
//
// Reader and writer of the HuggingFace safetensors format, the exchange format of model weights
// and layer inputs/outputs between Switchyard and PyTorch:
//
//   [8 bytes: N, little-endian u64] [N bytes: UTF-8 JSON header] [byte buffer]
//
//   header = {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"key": "value", ...}}      (the metadata entry is optional)
//
// Offsets are relative to the start of the byte buffer; tensors are dense, row-major and
// little-endian. The reader accepts exactly the files that the reference implementation
// (Python/Rust `safetensors`) accepts, and additionally rejects duplicate JSON keys:
//   - N <= 100,000,000 and 8 + N <= file size; the header is a UTF-8 JSON object (surrounding
//     whitespace, such as the writer's padding spaces, is allowed);
//   - every entry has a known dtype, a shape of non-negative integers and data_offsets
//     [begin, end] with end - begin == numel * dtype size (other keys are ignored);
//   - sorted by offset, the tensors tile the byte buffer exactly: no overlap, no gap, no
//     trailing bytes;
//   - "__metadata__", if present and not null, maps strings to strings.
// Any violation gives kInvalidArgument naming the file and the problem; a missing file gives
// kNotFound. Malformed input never crashes the reader.
//
// Dtypes: F32, F64, BF16, F16, I32, I64, U8 and BOOL map onto `DType`. The format's other
// dtypes (I8, I16, U16, U32, U64, F8_*, ...) are recognised and validated so that such a file
// still opens, but `Get` of such a tensor answers kUnimplemented.
#ifndef SWITCHYARD_COMMON_SAFETENSORS_H_
#define SWITCHYARD_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace switchyard {

// A parsed, validated safetensors file. The file is memory-mapped read-only (MAP_PRIVATE,
// PROT_READ); `Get` returns CPU `Tensor` views into that mapping, so loading costs no copy.
//
// Lifetime: copies of a SafetensorsFile share the mapping; it is unmapped when the last copy is
// destroyed. A Tensor from `Get` is valid while any copy lives.
// The views are READ-ONLY although `Tensor::data` is not const: writing through one faults.
// Copy into a Buffer (kernels/runtime/buffer.h CopyTensor) to modify. As with any mapping, a file
// that another process truncates while mapped makes reads of the lost pages fault (SIGBUS); files
// are replaced by rename (as SafetensorsWriter does), never rewritten in place. Alignment: every
// view is aligned to its dtype size. Files from the reference writer (and from SafetensorsWriter)
// are laid out so; the tensors of a file that is not are copied once, at Open, into aligned memory
// owned with the mapping. Thread-safety: all methods are const and may be called from any thread
// concurrently.
class SafetensorsFile {
 public:
  // Maps and validates `path`. kNotFound if it does not exist, kInvalidArgument if it is not a
  // valid safetensors file (the message names `path` and the rule broken), other codes for I/O
  // errors (from errno).
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Validates an in-memory image of a file (copied into aligned memory). `label` stands for the
  // file name in error messages.
  static absl::StatusOr<SafetensorsFile> FromBytes(absl::string_view bytes,
                                                   std::string label = "<memory>");

  // The path given to Open (or the label given to FromBytes).
  const std::string& path() const;
  // Tensor names in lexicographic order, without "__metadata__".
  std::vector<std::string> Names() const;
  bool Has(absl::string_view name) const;
  // A read-only CPU view of tensor `name` (shape as in the header; a 0-d tensor has shape {}).
  // kNotFound if absent; kUnimplemented if its dtype has no `DType` (the message names it).
  absl::StatusOr<Tensor> Get(absl::string_view name) const;
  // The "__metadata__" entry (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct State;
  explicit SafetensorsFile(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

// Collects tensor views and metadata, then writes one safetensors file.
//
// Layout matches the reference writer byte for byte: header and data ordered by dtype size
// (descending, in the reference's dtype order) then name, so every tensor is aligned to its
// dtype size; "__metadata__" first, omitted when empty; compact JSON; the header padded with
// spaces to a multiple of 8.
//
// `Add` keeps a VIEW: the tensor's memory must stay valid and unchanged until Write/ToBytes
// returns. Argument errors of Add (a CUDA tensor, a null pointer, a negative dim, a duplicate
// or reserved name) are recorded and returned by Write/ToBytes, which then write nothing.
// Not thread-safe; reusable (Write may be called several times).
class SafetensorsWriter {
 public:
  // Adds tensor `name` (any UTF-8 string but "__metadata__"), a CPU tensor of any DType.
  void Add(std::string name, const Tensor& cpu_tensor);
  // Sets metadata `key` to `value` (last call wins).
  void SetMetadata(std::string key, std::string value);

  // Writes the file atomically: to "<path>.tmp.<pid>", fsync, rename onto `path`, fsync the
  // directory. On error nothing is left at "<path>.tmp.<pid>" and `path` is untouched.
  absl::Status Write(const std::string& path) const;
  // The file's bytes, in memory.
  absl::StatusOr<std::string> ToBytes() const;

 private:
  struct Item {
    std::string name;
    Tensor tensor;
  };
  // Items in file order, header (with padding) and any recorded error.
  absl::StatusOr<std::string> Layout(std::vector<const Item*>* order) const;

  std::vector<Item> items_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
  absl::Status error_;
};

// The safetensors dtype string of `dtype` ("F32", "BF16", ...).
const char* SafetensorsDTypeName(DType dtype);

// Converts CPU tensor `src` into CPU tensor `dst` (same shape), elementwise:
//   - same dtype (any): a byte copy;
//   - among f32, f64 and bf16: widening is exact; narrowing rounds to nearest even
//     (f64 -> bf16 goes through f32, as PyTorch does, so it may round twice); NaN stays NaN.
// Other dtype pairs: kUnimplemented. Shape or device mismatch: kInvalidArgument. `src` and `dst`
// must not overlap.
absl::Status ConvertTensor(const Tensor& src, const Tensor& dst);

}  // namespace switchyard

#endif  // SWITCHYARD_COMMON_SAFETENSORS_H_
