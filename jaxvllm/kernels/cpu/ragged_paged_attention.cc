// Ragged paged attention on the CPU, called from XLA through its FFI.
//
// Same contract as kernels/xla/ragged_paged_attention.py: queries on a flat token axis, sequence s owns
// tokens cu_q_lens[s]:cu_q_lens[s+1], the last of its kv_lens[s] tokens of context, whose K/V
// are already in their pages. XLA on CPU can only reach pages by gathering copies of them;
// this kernel reads each page where it lies, once per block of up to kQueryBlock query tokens
// (attend.h does one such work item). This file checks the metadata, so a bad page index is an
// error and never a stray read, cuts the batch into work items and runs them, longest first,
// on the threads of XLA's own intra-op pool (parallel.h). The sliding window is an operand, not an
// attribute: a step whose layers differ in window calls one kernel with each layer's value. Two
// targets: a float32 cache, and a bfloat16 one stored as its bits (uint16, the CPU platform's
// kv_cache_floats_as_bits); both compute in float32.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attend.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jaxvllm::Attend;
using jaxvllm::Item;

constexpr int64_t kQueryBlock = 32;  // query tokens per work item: their rows share each page read

template <ffi::DataType kCache>
ffi::Error RaggedPagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<kCache> cache,
                                ffi::BufferR0<ffi::S32> layer, ffi::BufferR1<ffi::S32> kv_lens,
                                ffi::BufferR2<ffi::S32> page_indices, ffi::BufferR1<ffi::S32> cu_q_lens,
                                ffi::BufferR1<ffi::S32> num_seqs, ffi::BufferR0<ffi::S32> sliding_window,
                                ffi::ResultBuffer<ffi::F32> out, float sm_scale, float soft_cap) {
  const auto qd = q.dimensions(), cd = cache.dimensions();
  if (qd.size() != 3 || cd.size() != 6) return ffi::Error::InvalidArgument("q must be 3-D and kv_cache 6-D");
  using T = ffi::NativeType<kCache>;
  jaxvllm::Problem<T> p{q.typed_data(), cache.typed_data(), kv_lens.typed_data(), page_indices.typed_data(),
              cu_q_lens.typed_data(), out->typed_data(), layer.typed_data()[0], cd[2], cd[3], cd[4],
              qd[1], qd[2], page_indices.dimensions()[1], sm_scale, soft_cap, sliding_window.typed_data()[0]};
  const int64_t tokens = qd[0], max_seqs = page_indices.dimensions()[0];
  if (cd[5] != p.head_dim || p.q_heads % p.kv_heads != 0)
    return ffi::Error::InvalidArgument("q and kv_cache disagree on head_dim or q_heads % kv_heads != 0");
  if (p.layer < 0 || p.layer >= cd[0]) return ffi::Error::InvalidArgument("layer out of range");
  const int64_t n = num_seqs.typed_data()[0];
  std::vector<Item> items;
  if (n < 0 || n > max_seqs || cu_q_lens.dimensions()[0] != max_seqs + 1)
    return ffi::Error::InvalidArgument("num_seqs exceeds max_num_seqs");

  for (int64_t s = 0; s < n; ++s) {
    const int64_t first = p.cu_q_lens[s], last = p.cu_q_lens[s + 1], kv_len = p.kv_lens[s];
    if (first < 0 || last < first || last > tokens || kv_len < last - first ||
        kv_len > p.pages_per_seq * p.page_size)
      return ffi::Error::InvalidArgument("sequence " + std::to_string(s) + ": cu_q_lens/kv_lens out of range");
    for (int64_t i = 0; i < (kv_len + p.page_size - 1) / p.page_size; ++i) {
      const int32_t page = p.page_indices[s * p.pages_per_seq + i];
      if (page < 0 || page >= p.num_pages)
        return ffi::Error::InvalidArgument("sequence " + std::to_string(s) + ": page index out of range");
    }
    for (int64_t t = first; t < last; t += kQueryBlock) {
      const int64_t end = std::min(t + kQueryBlock, last);
      items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(t), static_cast<int32_t>(end),
                               (end - t) * (kv_len - (last - end) + 1)});
    }
  }
  const int64_t valid = n > 0 ? p.cu_q_lens[n] : 0;  // tokens past it are padding: zeros
  std::memset(p.out + valid * p.q_heads * p.head_dim, 0, (tokens - valid) * p.q_heads * p.head_dim * sizeof(float));
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  auto attend = p.head_dim == 64 ? Attend<T, 64> : p.head_dim == 128 ? Attend<T, 128> : Attend<T, 0>;
  auto shared_items = std::make_shared<std::vector<Item>>(std::move(items));
  jaxvllm::ParallelFor(pool, shared_items->size(), [p, attend, shared_items](int64_t i, std::vector<float>& buf) {
    attend(p, (*shared_items)[i], buf);
  });
  return ffi::Error::Success();
}

template <ffi::DataType kCache>
auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .template Arg<ffi::Buffer<kCache>>()
      .template Arg<ffi::BufferR0<ffi::S32>>()
      .template Arg<ffi::BufferR1<ffi::S32>>()
      .template Arg<ffi::BufferR2<ffi::S32>>()
      .template Arg<ffi::BufferR1<ffi::S32>>()
      .template Arg<ffi::BufferR1<ffi::S32>>()
      .template Arg<ffi::BufferR0<ffi::S32>>()  // sliding window, <= 0: none
      .template Ret<ffi::Buffer<ffi::F32>>()
      .template Attr<float>("sm_scale")
      .template Attr<float>("soft_cap");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmRaggedPagedAttention, RaggedPagedAttention<ffi::F32>, Binding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmRaggedPagedAttentionBf16Bits, RaggedPagedAttention<ffi::U16>,
                              Binding<ffi::U16>());
