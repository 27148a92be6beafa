// Validation, device dispatch and the CPU reference of the embedding lookup.
#include "kernels/embedding/embedding.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace switchyard::kernels {
namespace {

absl::Status CheckFloat(const Stream& stream, absl::string_view op,
                        std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    const bool ok = stream.is_cuda() ? (t->dtype == DType::kBF16 || t->dtype == DType::kF32)
                                     : (t->dtype == DType::kBF16 || t->dtype == DType::kF32 ||
                                        t->dtype == DType::kF64);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": unsupported dtype ", t->DebugString(), " on ",
                       stream.device.ToString(), " (bf16 or f32 on CUDA; f32, f64, bf16 on CPU)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckIds(const Tensor& ids, absl::string_view op) {
  if (ids.dtype != DType::kI32 || ids.rank() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ids must be i32 [T], got ", ids.DebugString()));
  }
  return absl::OkStatus();
}

// CPU only: every id must index a row of the table.
absl::Status CheckIdRange(const Tensor& ids, int64_t vocab, absl::string_view op) {
  const int32_t* p = ids.as<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    if (p[t] < 0 || p[t] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ids[", t, "] = ", p[t], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t EmbeddingBackwardWorkspaceBytes(int64_t num_tokens, int64_t vocab) {
  return 4 * ((vocab + 1) + vocab + 2 * num_tokens);
}

absl::Status EmbeddingForward(const Stream& stream, const Tensor& ids, const Tensor& table,
                              const Tensor& out) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&ids, &table, &out}));
  SY_RETURN_IF_ERROR(CheckIds(ids, "EmbeddingForward"));
  SY_RETURN_IF_ERROR(CheckFloat(stream, "EmbeddingForward", {&table, &out}));
  if (table.rank() != 2 || out.rank() != 2 || out.dim(0) != ids.dim(0) ||
      out.dim(1) != table.dim(1) || out.dtype != table.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbeddingForward: expected table [V, H] and out [T, H] of table's dtype with T = ",
        ids.dim(0), ", got table ", table.DebugString(), ", out ", out.DebugString()));
  }
  if (stream.is_cuda()) return internal::EmbeddingForwardCuda(stream, ids, table, out);
  const int64_t t_n = out.dim(0), h_n = out.dim(1);
  SY_RETURN_IF_ERROR(CheckIdRange(ids, table.dim(0), "EmbeddingForward"));
  const int32_t* id = ids.as<int32_t>();
  for (int64_t t = 0; t < t_n; ++t) {
    for (int64_t h = 0; h < h_n; ++h) {
      StoreFromDouble(out, t * h_n + h, LoadAsDouble(table, id[t] * h_n + h));
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const Stream& stream, const Tensor& ids, const Tensor& dout,
                               const Tensor& dtable, bool accumulate, const Tensor& workspace) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&ids, &dout, &dtable}));
  SY_RETURN_IF_ERROR(CheckIds(ids, "EmbeddingBackward"));
  SY_RETURN_IF_ERROR(CheckFloat(stream, "EmbeddingBackward", {&dout, &dtable}));
  if (dout.rank() != 2 || dtable.rank() != 2 || dout.dim(0) != ids.dim(0) ||
      dout.dim(1) != dtable.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbeddingBackward: expected dout [T, H] with T = ", ids.dim(0),
        " and dtable [V, H], got dout ", dout.DebugString(), ", dtable ", dtable.DebugString()));
  }
  const int64_t t_n = dout.dim(0), v_n = dtable.dim(0), h_n = dout.dim(1);
  if (stream.is_cuda()) {
    SY_RETURN_IF_ERROR(CheckDevice(stream, {&workspace}));
    const int64_t need = EmbeddingBackwardWorkspaceBytes(t_n, v_n);
    if (static_cast<int64_t>(workspace.bytes()) < need ||
        reinterpret_cast<uintptr_t>(workspace.data) % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmbeddingBackward: workspace ", workspace.DebugString(), " (",
                       workspace.bytes(), " bytes) must hold EmbeddingBackwardWorkspaceBytes(", t_n,
                       ", ", v_n, ") = ", need, " bytes, 4-byte aligned"));
    }
    if (t_n > INT32_MAX || v_n > INT32_MAX - 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("EmbeddingBackward: T (", t_n, ") and V (", v_n, ") must fit in int32"));
    }
    return internal::EmbeddingBackwardCuda(stream, ids, dout, dtable, accumulate, workspace);
  }
  SY_RETURN_IF_ERROR(CheckIdRange(ids, v_n, "EmbeddingBackward"));
  // Counting sort of the tokens by id (stable), then one fp64 row sum per id in token order:
  // the same summation order as the CUDA path.
  const int32_t* id = ids.as<int32_t>();
  std::vector<int64_t> offset(v_n + 1, 0);
  for (int64_t t = 0; t < t_n; ++t) ++offset[id[t] + 1];
  for (int64_t v = 0; v < v_n; ++v) offset[v + 1] += offset[v];
  std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
  std::vector<int64_t> sorted(t_n);
  for (int64_t t = 0; t < t_n; ++t) sorted[cursor[id[t]]++] = t;
  std::vector<double> row(h_n);
  for (int64_t v = 0; v < v_n; ++v) {
    if (offset[v] == offset[v + 1]) {
      if (!accumulate) {
        for (int64_t h = 0; h < h_n; ++h) StoreFromDouble(dtable, v * h_n + h, 0.0);
      }
      continue;
    }
    for (int64_t h = 0; h < h_n; ++h) row[h] = accumulate ? LoadAsDouble(dtable, v * h_n + h) : 0;
    for (int64_t i = offset[v]; i < offset[v + 1]; ++i) {
      const int64_t t = sorted[i];
      for (int64_t h = 0; h < h_n; ++h) row[h] += LoadAsDouble(dout, t * h_n + h);
    }
    for (int64_t h = 0; h < h_n; ++h) StoreFromDouble(dtable, v * h_n + h, row[h]);
  }
  return absl::OkStatus();
}

namespace {

// The vocabulary-parallel ops' shared checks and the local-id map (see embedding.h).
absl::Status LocalIds(const Stream& stream, const Tensor& ids, int64_t vocab_start,
                      int64_t local_vocab, int64_t vocab_size, const Tensor& local_ids,
                      absl::string_view op) {
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&ids, &local_ids}));
  SY_RETURN_IF_ERROR(CheckIds(ids, op));
  SY_RETURN_IF_ERROR(CheckIds(local_ids, op));
  if (local_ids.numel() != ids.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": local_ids ", local_ids.DebugString(),
                                                   " must have the shape of ids ",
                                                   ids.DebugString()));
  }
  if (vocab_start < 0 || local_vocab < 0 || vocab_start + local_vocab > vocab_size ||
      vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the vocabulary slice [", vocab_start, ", ", vocab_start + local_vocab,
                     ") must lie inside [0, ", vocab_size, ") (vocab_size <= INT32_MAX)"));
  }
  if (stream.is_cuda()) {
    return internal::LocalVocabIdsCuda(stream, ids, vocab_start, local_vocab, local_ids);
  }
  SY_RETURN_IF_ERROR(CheckIdRange(ids, vocab_size, op));
  const int32_t* id = ids.as<int32_t>();
  int32_t* local = local_ids.as<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    const int64_t l = static_cast<int64_t>(id[t]) - vocab_start;
    local[t] = l >= 0 && l < local_vocab ? static_cast<int32_t>(l) : -1;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VocabShardEmbeddingForward(const Stream& stream, const Tensor& ids,
                                        const Tensor& table, int64_t vocab_start,
                                        int64_t vocab_size, const Tensor& local_ids,
                                        const Tensor& out) {
  constexpr absl::string_view kOp = "VocabShardEmbeddingForward";
  if (table.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": table must be [V_l, H], got ", table.DebugString()));
  }
  SY_RETURN_IF_ERROR(LocalIds(stream, ids, vocab_start, table.dim(0), vocab_size, local_ids, kOp));
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&table, &out}));
  SY_RETURN_IF_ERROR(CheckFloat(stream, kOp, {&table, &out}));
  if (out.rank() != 2 || out.dim(0) != ids.dim(0) || out.dim(1) != table.dim(1) ||
      out.dtype != table.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": expected out [T, H] of table's dtype with T = ", ids.dim(0),
                     ", got table ", table.DebugString(), ", out ", out.DebugString()));
  }
  // CUDA: the plain lookup writes a zero row for the −1 entries.
  if (stream.is_cuda()) return internal::EmbeddingForwardCuda(stream, local_ids, table, out);
  const int64_t t_n = out.dim(0), h_n = out.dim(1);
  const int32_t* local = local_ids.as<int32_t>();
  for (int64_t t = 0; t < t_n; ++t) {
    for (int64_t h = 0; h < h_n; ++h) {
      StoreFromDouble(out, t * h_n + h,
                      local[t] < 0 ? 0.0 : LoadAsDouble(table, local[t] * h_n + h));
    }
  }
  return absl::OkStatus();
}

absl::Status VocabShardEmbeddingBackward(const Stream& stream, const Tensor& ids,
                                         const Tensor& dout, const Tensor& dtable,
                                         int64_t vocab_start, int64_t vocab_size,
                                         const Tensor& local_ids, bool accumulate,
                                         const Tensor& workspace) {
  constexpr absl::string_view kOp = "VocabShardEmbeddingBackward";
  if (dtable.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": dtable must be [V_l, H], got ", dtable.DebugString()));
  }
  SY_RETURN_IF_ERROR(LocalIds(stream, ids, vocab_start, dtable.dim(0), vocab_size, local_ids, kOp));
  if (stream.is_cuda()) {
    // The plain backward drops the −1 tokens (no gradient).
    return EmbeddingBackward(stream, local_ids, dout, dtable, accumulate, workspace);
  }
  SY_RETURN_IF_ERROR(CheckDevice(stream, {&dout, &dtable}));
  SY_RETURN_IF_ERROR(CheckFloat(stream, kOp, {&dout, &dtable}));
  if (dout.rank() != 2 || dout.dim(0) != ids.dim(0) || dout.dim(1) != dtable.dim(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": expected dout [T, H] with T = ", ids.dim(0), ", got dout ",
                     dout.DebugString(), ", dtable ", dtable.DebugString()));
  }
  // The tokens this rank owns, in ascending order, per local row: the same fp64 row sums as
  // EmbeddingBackward's (and one process's for these rows).
  const int64_t t_n = dout.dim(0), v_n = dtable.dim(0), h_n = dout.dim(1);
  const int32_t* local = local_ids.as<int32_t>();
  std::vector<std::vector<int64_t>> tokens(v_n);
  for (int64_t t = 0; t < t_n; ++t) {
    if (local[t] >= 0) tokens[local[t]].push_back(t);
  }
  std::vector<double> row(h_n);
  for (int64_t v = 0; v < v_n; ++v) {
    if (tokens[v].empty() && accumulate) continue;
    for (int64_t h = 0; h < h_n; ++h) row[h] = accumulate ? LoadAsDouble(dtable, v * h_n + h) : 0;
    for (int64_t t : tokens[v]) {
      for (int64_t h = 0; h < h_n; ++h) row[h] += LoadAsDouble(dout, t * h_n + h);
    }
    for (int64_t h = 0; h < h_n; ++h) StoreFromDouble(dtable, v * h_n + h, row[h]);
  }
  return absl::OkStatus();
}

}  // namespace switchyard::kernels
