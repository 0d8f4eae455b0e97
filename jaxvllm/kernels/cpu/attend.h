// One work item of the CPU ragged paged attention: a sequence's block of query tokens against
// its pages, with an online softmax. Rows are (token, q head); the rows of KV head h are q heads
// h*group..(h+1)*group-1. kD > 0 fixes head_dim at compile time so loops over it unroll and a
// row's accumulator stays in registers; kD == 0 serves any head_dim. T is the cache element:
// float, or uint16_t holding bfloat16's bits (widened to float as loaded; the math is float32).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace jaxvllm {

constexpr float kMaskValue = -0.7f * 3.40282346638528859811704183484516925440e+38f;
constexpr int64_t kKeys = 8;  // keys scored together in a prefill block: independent FMA chains

template <typename T>
struct Problem {
  const float* q;       // [tokens, q_heads, head_dim]
  const T* cache;       // [layers, 2, pages, page_size, kv_heads, head_dim]
  const int32_t* kv_lens;
  const int32_t* page_indices;  // [max_num_seqs, pages_per_seq]
  const int32_t* cu_q_lens;
  float* out;
  int64_t layer, num_pages, page_size, kv_heads, q_heads, head_dim, pages_per_seq;
  float sm_scale, soft_cap;
  int64_t sliding_window;  // <= 0: none

  const T* KPage(int64_t page) const {
    return cache + (layer * 2 * num_pages + page) * page_size * kv_heads * head_dim;
  }
  int64_t VOffset() const { return num_pages * page_size * kv_heads * head_dim; }  // K -> V
};

struct Item {
  int32_t seq, first, last;  // query tokens [first, last) of sequence seq
  int64_t cost;
};

// acc[i] = acc[i] * alpha[i] + sum_j w[j * w_stride + i] * v[j * v_stride] for kRows rows
// (acc rows contiguous, D long), the rows in registers when kD allows.
template <int64_t kD, int64_t kRows, typename T>
inline void AddValues(float* acc, int64_t D, const float* alpha, const float* w, int64_t w_stride,
                      const T* v, int64_t v_stride, int64_t len) {
  if constexpr (kD > 0 && kD % kLanes == 0) {
    constexpr int64_t kU = kD / kLanes;
    F16 a[kRows][kU];
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t u = 0; u < kU; ++u) a[i][u] = Load(acc + i * kD + u * kLanes) * alpha[i];
    for (int64_t j = 0; j < len; ++j) {
      F16 vj[kU];
      for (int64_t u = 0; u < kU; ++u) vj[u] = Load(v + j * v_stride + u * kLanes);
      for (int64_t i = 0; i < kRows; ++i)
        for (int64_t u = 0; u < kU; ++u) a[i][u] += w[j * w_stride + i] * vj[u];
    }
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t u = 0; u < kU; ++u) Store(acc + i * kD + u * kLanes, a[i][u]);
  } else {
    for (int64_t i = 0; i < kRows; ++i) {
      float* ar = acc + i * D;
      for (int64_t d = 0; d < D; ++d) ar[d] *= alpha[i];
      for (int64_t j = 0; j < len; ++j)
        for (int64_t d = 0; d < D; ++d) ar[d] += w[j * w_stride + i] * ToFloat(v[j * v_stride + d]);
    }
  }
}

// One query row's scores against keys [j_lo, j_hi) of a page of ps keys (ps a multiple of
// kLanes), soft-capped, the others masked, into s[0, ps); returns the running max with them. The keys go 16
// at a time: per key one vector of partial products, then HorizontalSums for all 16.
template <int64_t kD, typename T>
inline float Scores16(const float* qr, const T* k, int64_t kv_row, int64_t ps, int64_t j_lo,
                      int64_t j_hi, float soft_cap, float* s, float mx) {
  if constexpr (kD > 0 && kD % kLanes == 0) {
    constexpr int64_t kU = kD / kLanes;
    F16 qv[kU];
    for (int64_t u = 0; u < kU; ++u) qv[u] = Load(qr + u * kLanes);
    const F16 masked = F16{} + kMaskValue;
    const I16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    F16 top = F16{} + mx;
    for (int64_t c = 0; c < ps; c += kLanes) {
      if (c >= j_hi || c + kLanes <= j_lo) {
        Store(s + c, masked);
        continue;
      }
      F16 part[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) {
        const T* kj = k + (c + j) * kv_row;
        F16 acc = Load(kj) * qv[0];
        for (int64_t u = 1; u < kU; ++u) acc += Load(kj + u * kLanes) * qv[u];
        part[j] = acc;
      }
      const I16 key = lane + static_cast<int32_t>(c);
      const F16 sc = (key >= static_cast<int32_t>(j_lo)) & (key < static_cast<int32_t>(j_hi)) ? SoftCap(HorizontalSums(part), soft_cap) : masked;
      Store(s + c, sc);
      top = sc > top ? sc : top;
    }
    for (int64_t x = 0; x < kLanes; ++x) mx = std::max(mx, top[x]);
  }
  return mx;
}

// Decode (one query token): each row's scores against a page are dot products, then one
// exp per key. Memory-bound: the next page is prefetched, a share per row, while this one is used.
template <typename T, int64_t kD>
void AttendDecode(const Problem<T>& p, const Item& it, std::vector<float>& buf) {
  const int64_t D = kD > 0 ? kD : p.head_dim, H = p.q_heads, group = p.q_heads / p.kv_heads;
  const int64_t ps = p.page_size, kv_row = p.kv_heads * D, tile = (ps + kLanes - 1) / kLanes * kLanes;
  buf.resize(H * (2 * D + 2) + tile);
  float *q = buf.data(), *acc = q + H * D, *m = acc + H * D, *l = m + H, *s = l + H;
  for (int64_t i = 0; i < H * D; ++i) q[i] = p.q[it.first * H * D + i] * p.sm_scale;
  std::fill(acc, acc + H * D, 0.0f);
  std::fill(m, m + H, kMaskValue);
  std::fill(l, l + H, 0.0f);

  const int64_t q_pos = p.kv_lens[it.seq] - 1;
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(q_pos - p.sliding_window + 1, 0) : 0;
  const int32_t* pages = p.page_indices + it.seq * p.pages_per_seq;
  for (int64_t start = lo / ps * ps; start <= q_pos; start += ps) {
    const T* next = start + ps <= q_pos ? p.KPage(pages[start / ps + 1]) : nullptr;
    const int64_t share = ps * kv_row / H / kLanes * kLanes;  // elements of the next page per row
    const int64_t j_lo = std::max<int64_t>(lo - start, 0), j_hi = std::min<int64_t>(q_pos + 1 - start, ps);
    for (int64_t r = 0; r < H; ++r) {
      const T* k = p.KPage(pages[start / ps]) + (r / group) * D;
      const float* qr = q + r * D;
      if (next != nullptr)  // a share of the next page per row: a whole page at once stalled
        PrefetchPage(next + r * share, p.VOffset(), r + 1 < H ? share : ps * kv_row - r * share);
      float mx = m[r];
      if (kD > 0 && kD % kLanes == 0 && ps % kLanes == 0) {
        mx = Scores16<kD>(qr, k, kv_row, ps, j_lo, j_hi, p.soft_cap, s, mx);
      } else {
        std::fill(s, s + tile, kMaskValue);
        for (int64_t j = j_lo; j < j_hi; ++j) {
          const T* kj = k + j * kv_row;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qr[d] * ToFloat(kj[d]);
          if (p.soft_cap > 0.0f) dot = p.soft_cap * std::tanh(dot / p.soft_cap);
          s[j] = dot;
          mx = std::max(mx, dot);
        }
      }
      F16 sum = {};
      for (int64_t t = 0; t < tile; t += kLanes) {
        const F16 e = Exp(Load(s + t) - mx);
        Store(s + t, e);
        sum += e;
      }
      const float alpha = Exp(m[r] - mx);
      AddValues<kD, 1>(acc + r * D, D, &alpha, s + j_lo, 1, k + p.VOffset() + j_lo * kv_row, kv_row, j_hi - j_lo);
      l[r] = l[r] * alpha + Sum(sum);
      m[r] = mx;
    }
  }
  for (int64_t r = 0; r < H; ++r)
    for (int64_t d = 0; d < D; ++d) p.out[(it.first * H + r) * D + d] = acc[r * D + d] / l[r];
}

// Prefill (a block of query tokens): each page is read once for all rows and KV heads. The
// rows of a KV head lie across SIMD lanes, queries stored transposed [D, R], so kKeys keys'
// scores against kLanes rows are FMAs of broadcast key elements, and the softmax statistics
// update lane-wise: no horizontal sums and no transposes per page.
template <typename T, int64_t kD>
void AttendBlock(const Problem<T>& p, const Item& it, std::vector<float>& buf) {
  const int64_t D = kD > 0 ? kD : p.head_dim, H = p.q_heads, group = p.q_heads / p.kv_heads;
  const int64_t ps = p.page_size, kv_row = p.kv_heads * D;
  const int64_t rows = (it.last - it.first) * group, R = (rows + kLanes - 1) / kLanes * kLanes;
  const int64_t per_head = R * (2 * D + 2);  // queries [D, R], accumulators [R, D], max, sum
  buf.resize(p.kv_heads * per_head + R + ps * R);
  float* q_pos = buf.data() + p.kv_heads * per_head;  // [R] (exact below 2**24); padding rows -1
  float* s = q_pos + R;                                // [ps, R] scores, then their exps
  auto state = [&](int64_t h) {
    float* b = buf.data() + h * per_head;
    return std::make_tuple(b, b + D * R, b + 2 * D * R, b + 2 * D * R + R);
  };

  const int64_t kv_len = p.kv_lens[it.seq], seq_end = p.cu_q_lens[it.seq + 1];
  auto pos_of = [&](int64_t t) { return kv_len - (seq_end - t); };
  const int64_t hi = pos_of(it.last - 1) + 1;
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(pos_of(it.first) - p.sliding_window + 1, 0) : 0;
  const float window = p.sliding_window > 0 ? static_cast<float>(p.sliding_window) : 3e38f;
  const int32_t* pages = p.page_indices + it.seq * p.pages_per_seq;
  for (int64_t r = 0; r < R; ++r) q_pos[r] = r < rows ? static_cast<float>(pos_of(it.first + r / group)) : -1.0f;
  for (int64_t h = 0; h < p.kv_heads; ++h) {
    auto [qt, acc, m, l] = state(h);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < D; ++d)
        qt[d * R + r] = r < rows ? p.q[((it.first + r / group) * H + h * group + r % group) * D + d] * p.sm_scale : 0.0f;
    std::fill(acc, acc + R * D, 0.0f);
    std::fill(m, m + R, kMaskValue);
    std::fill(l, l + R, 0.0f);
  }

  for (int64_t start = lo / ps * ps; start < hi; start += ps) {
    if (start + ps < hi) PrefetchPage(p.KPage(pages[start / ps + 1]), p.VOffset(), ps * kv_row);
    const int64_t len = std::min(ps, hi - start);
    for (int64_t h = 0; h < p.kv_heads; ++h) {
      auto [qt, acc, m, l] = state(h);
      const T* k = p.KPage(pages[start / ps]) + h * D;
      // Scores, masked. Keys past `len` but inside the page are scored and never used.
      for (int64_t j0 = 0; j0 < len; j0 += kKeys) {
        const int64_t step = j0 + kKeys <= ps ? kKeys : 1;
        for (int64_t j = j0; j < std::min(j0 + kKeys, len); j += step) {
          for (int64_t r0 = 0; r0 < R; r0 += kLanes) {
            F16 a[kKeys] = {};
            if (step == kKeys) {
              for (int64_t d = 0; d < D; ++d) {
                const F16 qd = Load(qt + d * R + r0);
                for (int64_t i = 0; i < kKeys; ++i) a[i] += ToFloat(k[(j + i) * kv_row + d]) * qd;
              }
            } else {
              for (int64_t d = 0; d < D; ++d) a[0] += ToFloat(k[j * kv_row + d]) * Load(qt + d * R + r0);
            }
            const F16 qp = Load(q_pos + r0), masked = F16{} + kMaskValue;
            for (int64_t i = 0; i < step && j + i < len; ++i) {
              a[i] = SoftCap(a[i], p.soft_cap);
              const float kv_pos = static_cast<float>(start + j + i);
              Store(s + (j + i) * R + r0, kv_pos <= qp && kv_pos > qp - window ? a[i] : masked);
            }
          }
        }
      }
      for (int64_t r0 = 0; r0 < R; r0 += kLanes) {  // new max, exps, rescale, then values
        const F16 m_old = Load(m + r0), masked = F16{} + kMaskValue;
        F16 mx = m_old, sum = {};
        for (int64_t j = 0; j < len; ++j) {
          const F16 sc = Load(s + j * R + r0);
          mx = sc > mx ? sc : mx;
        }
        for (int64_t j = 0; j < len; ++j) {  // a row with nothing visible yet keeps exps 0
          const F16 sc = Load(s + j * R + r0), e = sc == masked ? F16{} : Exp(sc - mx);
          Store(s + j * R + r0, e);
          sum += e;
        }
        float alpha[kLanes];
        Store(alpha, Exp(m_old - mx));
        Store(l + r0, Load(l + r0) * Load(alpha) + sum);
        Store(m + r0, mx);
        constexpr int64_t kRows = kD > 64 ? 2 : 4;  // rows whose accumulators fit in registers
        for (int64_t x = 0; x < kLanes && r0 + x < rows; x += kRows)
          AddValues<kD, kRows>(acc + (r0 + x) * D, D, alpha + x, s + r0 + x, R, k + p.VOffset(), kv_row, len);
      }
    }
  }
  for (int64_t h = 0; h < p.kv_heads; ++h) {
    auto [qt, acc, m, l] = state(h);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < D; ++d)
        p.out[((it.first + r / group) * H + h * group + r % group) * D + d] = acc[r * D + d] / l[r];
  }
}

template <typename T, int64_t kD>
void Attend(const Problem<T>& p, const Item& it, std::vector<float>& buf) {
  if (it.last - it.first == 1) AttendDecode<T, kD>(p, it, buf);
  else AttendBlock<T, kD>(p, it, buf);
}

}  // namespace jaxvllm
