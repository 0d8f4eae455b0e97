// Ragged paged attention on the CPU, called from XLA through its FFI.
//
// Same contract as pallas_kernels/reference.py: queries on a flat token axis, sequence s owns
// tokens cu_q_lens[s]:cu_q_lens[s+1], the last of its kv_lens[s] tokens of context, whose K/V
// are already in their pages. XLA on CPU can only reach pages by gathering copies of them;
// this kernel reads each page where it lies, once per block of query tokens, all KV heads of
// a page together (one contiguous run of memory), with an online softmax per query row.
// Work items (a sequence's block of tokens) go longest first to the threads of XLA's own
// intra-op pool.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr float kMaskValue = -0.7f * 3.40282346638528859811704183484516925440e+38f;
constexpr int64_t kQueryBlock = 32;  // query tokens per work item: their rows share each page read

struct Problem {
  const float* q;       // [tokens, q_heads, head_dim]
  const float* cache;   // [layers, 2, pages, page_size, kv_heads, head_dim]
  const int32_t* kv_lens;
  const int32_t* page_indices;  // [max_num_seqs, pages_per_seq]
  const int32_t* cu_q_lens;
  float* out;
  int64_t layer, num_pages, page_size, kv_heads, q_heads, head_dim, pages_per_seq;
  float sm_scale, soft_cap;
  int64_t sliding_window;  // 0: none
};

struct Item {
  int32_t seq, first, last;  // query tokens [first, last) of sequence seq
  int64_t cost;
};

// exp for the softmax, in plain arithmetic so that loops over it vectorize (Cephes' expf
// polynomial; relative error about 1e-7). Below -87 it is 0: masked scores vanish.
inline float Exp(float x) {
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(std::max(n, -126.0f)) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? 0.0f : y * scale;
}

// Prefetch a page's K and V (all KV heads): the next page of a sequence lies elsewhere.
inline void PrefetchPage(const float* k, int64_t v_offset, int64_t floats) {
  for (int64_t b = 0; b < floats; b += 16) {
    __builtin_prefetch(k + b);
    __builtin_prefetch(k + v_offset + b);
  }
}

// A work item of one token (decode), row by row: rows are the token's q heads; a row's
// scores against a page are dot products with its KV head's keys. kD > 0 fixes head_dim at
// compile time so the loops over it unroll and a row's accumulator stays in registers.
template <int64_t kD>
void AttendRows(const Problem& p, const Item& it, std::vector<float>& buf) {
  const int64_t D = kD > 0 ? kD : p.head_dim, H = p.q_heads, group = p.q_heads / p.kv_heads;
  const int64_t ps = p.page_size, n = it.last - it.first, rows = n * H, kv_row = p.kv_heads * D;
  buf.resize(rows * (2 * D + 2) + 2 * ps);
  float* q = buf.data();        // [rows, D], scaled
  float* acc = q + rows * D;    // [rows, D]
  float* m = acc + rows * D;    // [rows]
  float* l = m + rows;          // [rows]
  float* s = l + rows;          // [ps] scores of one row against one page
  float* e = s + ps;            // [ps] their exps
  const float* src = p.q + it.first * H * D;
  for (int64_t i = 0; i < rows * D; ++i) q[i] = src[i] * p.sm_scale;
  std::fill(acc, acc + rows * D, 0.0f);
  std::fill(m, m + rows, kMaskValue);
  std::fill(l, l + rows, 0.0f);

  const int64_t kv_len = p.kv_lens[it.seq], seq_end = p.cu_q_lens[it.seq + 1];
  auto pos_of = [&](int64_t t) { return kv_len - (seq_end - t); };
  const int64_t hi = pos_of(it.last - 1) + 1;
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(pos_of(it.first) - p.sliding_window + 1, 0) : 0;
  const int32_t* pages = p.page_indices + it.seq * p.pages_per_seq;
  const int64_t layer_rows = p.num_pages * ps;  // K or V rows of one layer

  for (int64_t start = lo / ps * ps; start < hi; start += ps) {
    const float* k_page = p.cache + ((p.layer * 2) * layer_rows + pages[start / ps] * ps) * kv_row;
    const float* v_page = k_page + layer_rows * kv_row;
    if (start + ps < hi)
      PrefetchPage(p.cache + ((p.layer * 2) * layer_rows + pages[start / ps + 1] * ps) * kv_row,
                   layer_rows * kv_row, ps * kv_row);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t q_pos = pos_of(it.first + i);
      const int64_t j_lo = std::max<int64_t>(p.sliding_window > 0 ? q_pos - p.sliding_window + 1 - start : 0, 0);
      const int64_t j_hi = std::min<int64_t>(q_pos + 1 - start, ps);
      if (j_hi <= j_lo) continue;
      for (int64_t h = 0; h < p.kv_heads; ++h) {
        const float* k = k_page + h * D;
        const float* v = v_page + h * D;
        for (int64_t r = i * H + h * group; r < i * H + (h + 1) * group; ++r) {
          const float* qr = q + r * D;
          float mx = m[r];
          for (int64_t j = j_lo; j < j_hi; ++j) {
            const float* kj = k + j * kv_row;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qr[d] * kj[d];
            if (p.soft_cap > 0.0f) dot = p.soft_cap * std::tanh(dot / p.soft_cap);
            s[j] = dot;
            mx = std::max(mx, dot);
          }
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = j_lo; j < j_hi; ++j) {
            e[j] = Exp(s[j] - mx);
            sum += e[j];
          }
          const float alpha = Exp(m[r] - mx);
          float* ar = acc + r * D;
          float a[kD > 0 ? kD : 1];
          float* out = kD > 0 ? a : ar;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) out[d] = ar[d] * alpha;
          for (int64_t j = j_lo; j < j_hi; ++j) {
            const float* vj = v + j * kv_row;
            const float w = e[j];
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) out[d] += w * vj[d];
          }
          if (kD > 0) std::memcpy(ar, a, D * sizeof(float));
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
        }
      }
    }
  }
  float* dst = p.out + it.first * H * D;
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < D; ++d) dst[r * D + d] = acc[r * D + d] * inv;
  }
}

// A work item of several tokens (a prefill block), a KV head at a time. Its rows (token,
// q head in the group) lie across SIMD lanes: queries are stored transposed, [head_dim, rows],
// so a key's scores against all rows are kLanes-wide FMAs of the key's elements, and the
// softmax statistics of all rows update lane-wise. No horizontal sums, no transposes per page.
constexpr int64_t kLanes = 16;
typedef float F16 __attribute__((vector_size(kLanes * sizeof(float))));  // GCC/Clang vectors
typedef int32_t I16 __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline F16 Load(const float* p) { F16 v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void Store(float* p, F16 v) { std::memcpy(p, &v, sizeof(v)); }

// Exp above, lane-wise (the compiler does not vectorize it reliably inside unrolled loops).
inline F16 Exp(F16 x) {
  const F16 zero = {}, n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round
  const F16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
  F16 y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  I16 e = __builtin_convertvector(x < -87.0f ? zero : n, I16) + 127;
  return x < -87.0f ? zero : y * reinterpret_cast<F16&>(e <<= 23);
}

template <int64_t kD>
void AttendBlock(const Problem& p, const Item& it, std::vector<float>& buf) {
  const int64_t D = kD > 0 ? kD : p.head_dim, H = p.q_heads, group = p.q_heads / p.kv_heads;
  const int64_t ps = p.page_size, n = it.last - it.first, kv_row = p.kv_heads * D;
  const int64_t rows = n * group, R = (rows + kLanes - 1) / kLanes * kLanes;  // per KV head
  buf.resize(R * (2 * D + 3) + ps * R);
  float* qt = buf.data();      // [D, R], scaled
  float* acc = qt + D * R;     // [R, D]
  float* m = acc + R * D;      // [R]
  float* l = m + R;            // [R]
  float* q_pos = l + R;        // [R] as float (exact below 2**24); padding rows: -1
  float* s = q_pos + R;        // [ps, R] scores, then their exps

  const int64_t kv_len = p.kv_lens[it.seq], seq_end = p.cu_q_lens[it.seq + 1];
  auto pos_of = [&](int64_t t) { return kv_len - (seq_end - t); };
  const int64_t hi = pos_of(it.last - 1) + 1;
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(pos_of(it.first) - p.sliding_window + 1, 0) : 0;
  const float window = p.sliding_window > 0 ? static_cast<float>(p.sliding_window) : 3e38f;
  const int32_t* pages = p.page_indices + it.seq * p.pages_per_seq;
  const int64_t layer_rows = p.num_pages * ps;
  for (int64_t r = 0; r < R; ++r) q_pos[r] = r < rows ? static_cast<float>(pos_of(it.first + r / group)) : -1.0f;

  for (int64_t h = 0; h < p.kv_heads; ++h) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < D; ++d)
        qt[d * R + r] = r < rows ? p.q[((it.first + r / group) * H + h * group + r % group) * D + d] * p.sm_scale : 0.0f;
    std::fill(acc, acc + R * D, 0.0f);
    std::fill(m, m + R, kMaskValue);
    std::fill(l, l + R, 0.0f);
    for (int64_t start = lo / ps * ps; start < hi; start += ps) {
      const float* k = p.cache + ((p.layer * 2) * layer_rows + pages[start / ps] * ps) * kv_row + h * D;
      const float* v = k + layer_rows * kv_row;
      if (h == 0 && start + ps < hi)
        PrefetchPage(p.cache + ((p.layer * 2) * layer_rows + pages[start / ps + 1] * ps) * kv_row,
                     layer_rows * kv_row, ps * kv_row);
      const int64_t len = std::min(ps, hi - start);
      for (int64_t j = 0; j < len; ++j) {  // scores, masked, and each row's running max
        const float* kj = k + j * kv_row;
        const float kv_pos = static_cast<float>(start + j);
        for (int64_t r0 = 0; r0 < R; r0 += kLanes) {
          F16 a = {};
          for (int64_t d = 0; d < D; ++d) a += kj[d] * Load(qt + d * R + r0);
          if (p.soft_cap > 0.0f)
            for (int64_t x = 0; x < kLanes; ++x) a[x] = p.soft_cap * std::tanh(a[x] / p.soft_cap);
          const F16 qp = Load(q_pos + r0), masked = F16{} + kMaskValue;
          Store(s + j * R + r0, kv_pos <= qp && kv_pos > qp - window ? a : masked);
        }
      }
      for (int64_t r0 = 0; r0 < R; r0 += kLanes) {  // rescale by the new max, then exps
        const F16 m_old = Load(m + r0), masked = F16{} + kMaskValue;
        F16 mx = m_old, sum = {};
        for (int64_t j = 0; j < len; ++j) {
          const F16 sc = Load(s + j * R + r0);
          mx = sc > mx ? sc : mx;
        }
        for (int64_t j = 0; j < len; ++j) {
          const F16 sc = Load(s + j * R + r0), e = sc == masked ? F16{} : Exp(sc - mx);
          Store(s + j * R + r0, e);
          sum += e;
        }
        const F16 alpha = Exp(m_old - mx);
        Store(l + r0, Load(l + r0) * alpha + sum);
        Store(m + r0, mx);
        for (int64_t x = 0; x < kLanes && r0 + x < rows; ++x) {  // acc row += exps @ V
          float* ar = acc + (r0 + x) * D;
          float a[kD > 0 ? kD : 1];
          float* out = kD > 0 ? a : ar;
          const float al = alpha[x];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) out[d] = ar[d] * al;
          for (int64_t j = 0; j < len; ++j) {
            const float w = s[j * R + r0 + x];
            const float* vj = v + j * kv_row;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) out[d] += w * vj[d];
          }
          if (kD > 0) std::memcpy(ar, a, D * sizeof(float));
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = p.out + ((it.first + r / group) * H + h * group + r % group) * D;
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      for (int64_t d = 0; d < D; ++d) dst[d] = acc[r * D + d] * inv;
    }
  }
}

template <int64_t kD>
void Attend(const Problem& p, const Item& it, std::vector<float>& buf) {
  if (it.last - it.first == 1) AttendRows<kD>(p, it, buf);
  else AttendBlock<kD>(p, it, buf);
}

// Items are claimed one at a time by the caller and by helpers on the pool. The caller
// waits only for items already claimed, so a helper that starts late finds nothing to do
// and never touches the call's buffers; the shared state outlives the call for it.
struct Shared {
  Problem problem;
  std::vector<Item> items;
  std::atomic<size_t> next{0};
  size_t done = 0;
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    std::vector<float> buf;
    size_t finished = 0;
    auto attend = problem.head_dim == 64 ? Attend<64> : problem.head_dim == 128 ? Attend<128> : Attend<0>;
    for (size_t i; (i = next.fetch_add(1)) < items.size(); ++finished) attend(problem, items[i], buf);
    if (finished == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    done += finished;
    if (done == items.size()) cv.notify_all();
  }
};

ffi::Error RaggedPagedAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> cache,
                                ffi::BufferR0<ffi::S32> layer, ffi::BufferR1<ffi::S32> kv_lens,
                                ffi::BufferR2<ffi::S32> page_indices, ffi::BufferR1<ffi::S32> cu_q_lens,
                                ffi::BufferR1<ffi::S32> num_seqs, ffi::ResultBuffer<ffi::F32> out,
                                float sm_scale, int64_t sliding_window, float soft_cap) {
  const auto qd = q.dimensions(), cd = cache.dimensions();
  if (qd.size() != 3 || cd.size() != 6) return ffi::Error::InvalidArgument("q must be 3-D and kv_cache 6-D");
  auto shared = std::make_shared<Shared>();
  Problem& p = shared->problem;
  p = Problem{q.typed_data(), cache.typed_data(), kv_lens.typed_data(), page_indices.typed_data(),
              cu_q_lens.typed_data(), out->typed_data(), layer.typed_data()[0], cd[2], cd[3], cd[4],
              qd[1], qd[2], page_indices.dimensions()[1], sm_scale, soft_cap, sliding_window};
  const int64_t tokens = qd[0], max_seqs = page_indices.dimensions()[0];
  if (cd[5] != p.head_dim || p.q_heads % p.kv_heads != 0)
    return ffi::Error::InvalidArgument("q and kv_cache disagree on head_dim or q_heads % kv_heads != 0");
  if (p.layer < 0 || p.layer >= cd[0]) return ffi::Error::InvalidArgument("layer out of range");
  const int64_t n = num_seqs.typed_data()[0];
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
      shared->items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(t), static_cast<int32_t>(end),
                               (end - t) * (kv_len - (last - end) + 1)});
    }
  }
  const int64_t valid = n > 0 ? p.cu_q_lens[n] : 0;  // tokens past it are padding: zeros
  std::memset(p.out + valid * p.q_heads * p.head_dim, 0, (tokens - valid) * p.q_heads * p.head_dim * sizeof(float));
  std::sort(shared->items.begin(), shared->items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  if (shared->items.empty()) return ffi::Error::Success();

  const int64_t helpers = std::min<int64_t>(pool.num_threads(), shared->items.size() - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([shared] { shared->Work(); });
  shared->Work();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait(lock, [&] { return shared->done == shared->items.size(); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmRaggedPagedAttention, RaggedPagedAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::BufferR0<ffi::S32>>()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
                                  .Arg<ffi::BufferR2<ffi::S32>>()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
                                  .Arg<ffi::BufferR1<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("sm_scale")
                                  .Attr<int64_t>("sliding_window")
                                  .Attr<float>("soft_cap"));
