// y = x @ w on the CPU, with w packed once, at load time, into panels of kPanel columns:
// w_packed[s, k, j] = w[k, s * kPanel + j]. Called from XLA through its FFI. The grouped
// form multiplies consecutive groups of x's rows by their own packed weights: a
// mixture-of-experts layer's experts, each read in place from the stack of them.
//
// XLA's CPU matmul repacks its right-hand operand on every call. A decode step multiplies a
// few rows by every weight of the model, so that repacking costs more than the product; with
// panels packed at load, the weights stream from memory once per call, in order. A micro-tile
// keeps up to kTileRows rows x kPanel columns of y in 24 vector registers over the whole
// inner dimension, and while one panel is in use the next one is prefetched.
//
// A bfloat16 model's weights are packed in pairs of rows (w_packed[s, k/2, j, k%2] =
// w[k, s * kPanel + j], the same shape): one 32-bit lane holds two bfloat16 of a column, the
// operand of AVX-512's bfloat16 dot product, which multiplies both by x's pair and adds them
// into a float32 lane, twice the float32 FMA's work per instruction. At a decode step's few rows
// XLA's bfloat16 dot (repacking its weight) took 2-10x as long; at 2048 rows about the same.
// Accumulation is float32 either way; without AVX512_BF16 the pairs are widened and multiplied
// in float32.
//
// x's rows are padded to a compiled bucket; only the first num_rows are real (the step's
// tokens). Those are multiplied and the padding rows of y are zeroed, so a step pays for its
// tokens, not for its bucket (a decode batch of 33 costs half of one of 64).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "parallel.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

using jaxvllm::F16;
using jaxvllm::I16;
using jaxvllm::kLanes;

constexpr int64_t kPanel = 2 * kLanes;  // columns per panel (must match native/packed_matmul.py)
constexpr int64_t kTileRows = 12;       // rows per micro-tile: 2 x 12 accumulators
constexpr int64_t kChunkRows = 192;     // rows per work item: their slice of x stays in L2

// acc + the dot products of 16 lanes of bfloat16 pairs (b) with one pair (a, two bfloat16
// in 32 bits), in float32.
inline F16 DotPairs(F16 acc, uint32_t a, const uint16_t* b) {
#if defined(__AVX512BF16__)
  return (F16)_mm512_dpbf16_ps((__m512)acc, (__m512bh)_mm512_set1_epi32(int(a)), (__m512bh)_mm512_loadu_si512(b));
#else
  I16 pairs;
  std::memcpy(&pairs, b, sizeof(pairs));
  const I16 even = pairs << 16, odd = pairs & int32_t(0xffff0000u);
  F16 e, o;
  std::memcpy(&e, &even, sizeof(e));
  std::memcpy(&o, &odd, sizeof(o));
  return acc + jaxvllm::ToFloat(uint16_t(a)) * e + jaxvllm::ToFloat(uint16_t(a >> 16)) * o;
#endif
}

// T: float, or uint16_t for bfloat16 (its bits, as XLA's FFI passes them).
template <typename T>
struct Matmul {
  static constexpr int64_t kStep = 4 / sizeof(T);  // rows of w per step: one, or a bfloat16 pair
  const T* x;  // [rows, depth]
  const T* w;  // [panels, depth, kPanel]
  float* y;    // [rows, panels * kPanel]
  int64_t rows, depth, panels, groups;

  // Rows [m, m + R) times panel s; `prefetch` walks the next panel, one line per step.
  template <int R>
  void Tile(int64_t m, int64_t s, const T*& prefetch, const T* prefetch_end) const {
    const T* panel = w + s * depth * kPanel;
    const T* xr = x + m * depth;
    F16 lo[R] = {}, hi[R] = {};
    for (int64_t k = 0; k < depth; k += kStep) {
      if (prefetch < prefetch_end) {
        __builtin_prefetch(prefetch);
        prefetch += 64 / sizeof(T);
      }
      const T* b = panel + k * kPanel;
      if constexpr (std::is_same_v<T, float>) {
        const F16 b0 = jaxvllm::Load(b), b1 = jaxvllm::Load(b + kLanes);
        for (int i = 0; i < R; ++i) {
          const float a = xr[i * depth + k];
          lo[i] += a * b0;
          hi[i] += a * b1;
        }
      } else {
        for (int i = 0; i < R; ++i) {
          uint32_t a;
          std::memcpy(&a, xr + i * depth + k, sizeof(a));
          lo[i] = DotPairs(lo[i], a, b);
          hi[i] = DotPairs(hi[i], a, b + 2 * kLanes);
        }
      }
    }
    const int64_t width = panels * kPanel;
    for (int i = 0; i < R; ++i) {
      jaxvllm::Store(y + (m + i) * width + s * kPanel, lo[i]);
      jaxvllm::Store(y + (m + i) * width + s * kPanel + kLanes, hi[i]);
    }
  }

  template <size_t... R>
  void AnyTile(int rows, int64_t m, int64_t s, const T*& pf, const T* pf_end,
               std::index_sequence<R...>) const {
    ((rows == int(R) + 1 ? Tile<int(R) + 1>(m, s, pf, pf_end) : void()), ...);
  }

  // Item: one chunk of rows against one contiguous group of panels, in tiles of even height.
  void operator()(int64_t item, std::vector<float>&) const {
    const int64_t g = item % groups, first = g * panels / groups, last = (g + 1) * panels / groups;
    const int64_t m0 = (item / groups) * kChunkRows, n = std::min(rows - m0, kChunkRows);
    const int64_t tiles = (n + kTileRows - 1) / kTileRows;
    for (int64_t s = first; s < last; ++s) {
      const T* pf = s + 1 < last ? w + (s + 1) * depth * kPanel : nullptr;
      const T* pf_end = pf ? pf + depth * kPanel : nullptr;
      for (int64_t t = 0, m = m0; t < tiles; ++t) {
        const int64_t h = (m0 + n - m + (tiles - t) - 1) / (tiles - t);
        AnyTile(int(h), m, s, pf, pf_end, std::make_index_sequence<kTileRows>{});
        m += h;
      }
    }
  }
};

template <ffi::DataType kType>
ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::Buffer<kType> x, ffi::Buffer<kType> w,
                        ffi::Buffer<ffi::S32> num_rows, ffi::ResultBuffer<ffi::F32> y) {
  using T = ffi::NativeType<kType>;
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2)
    return ffi::Error::InvalidArgument("packed_matmul: x must be 2-D, w_packed 3-D and y 2-D");
  if (wd[1] != xd[1] || wd[2] != kPanel)
    return ffi::Error::InvalidArgument("packed_matmul: w_packed must be [out/32, in, 32] with in = x.shape[1]");
  if (yd[0] != xd[0] || yd[1] != wd[0] * kPanel)
    return ffi::Error::InvalidArgument("packed_matmul: y must be [x.shape[0], 32 * w_packed.shape[0]]");
  if (xd[1] % Matmul<T>::kStep)
    return ffi::Error::InvalidArgument("packed_matmul: a bfloat16 x needs an even number of columns");
  if (num_rows.element_count() != 1)
    return ffi::Error::InvalidArgument("packed_matmul: num_rows must hold one value");
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, xd[0]);
  std::fill(y->typed_data() + rows * yd[1], y->typed_data() + xd[0] * yd[1], 0.0f);
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  // Two groups of panels per thread: enough to balance, few enough that prefetching pays.
  const int64_t groups = std::min<int64_t>(wd[0], 2 * (pool.num_threads() + 1));
  jaxvllm::ParallelFor(pool, chunks * groups,
                       Matmul<T>{x.typed_data(), w.typed_data(), y->typed_data(), rows, xd[1], wd[0], groups});
  return ffi::Error::Success();
}

// x's rows in consecutive groups (group_sizes[e] rows for expert e), each group times its
// expert's packed weight w[e] ([experts, panels, depth, kPanel]); rows past the last group
// are zeroed. Every group is a Matmul of its own rows (none for an empty one), and the
// items of all of them share one ParallelFor: an expert's weight is read where it lies,
// once per chunk of its rows, where slicing it out in XLA copied it first.
template <ffi::DataType kType>
ffi::Error GroupedPackedMatmul(ffi::ThreadPool pool, ffi::Buffer<kType> x, ffi::Buffer<kType> w,
                               ffi::Buffer<ffi::S32> group_sizes, ffi::ResultBuffer<ffi::F32> y) {
  using T = ffi::NativeType<kType>;
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 4 || yd.size() != 2)
    return ffi::Error::InvalidArgument("grouped_packed_matmul: x must be 2-D, w_packed 4-D and y 2-D");
  if (wd[2] != xd[1] || wd[3] != kPanel)
    return ffi::Error::InvalidArgument(
        "grouped_packed_matmul: w_packed must be [experts, out/32, in, 32] with in = x.shape[1]");
  if (yd[0] != xd[0] || yd[1] != wd[1] * kPanel)
    return ffi::Error::InvalidArgument("grouped_packed_matmul: y must be [x.shape[0], 32 * w_packed.shape[1]]");
  if (xd[1] % Matmul<T>::kStep)
    return ffi::Error::InvalidArgument("grouped_packed_matmul: a bfloat16 x needs an even number of columns");
  if (group_sizes.element_count() != wd[0])
    return ffi::Error::InvalidArgument("grouped_packed_matmul: group_sizes must hold one value per expert");
  const int64_t depth = xd[1], panels = wd[1], width = yd[1];
  const int64_t groups = std::min<int64_t>(panels, 2 * (pool.num_threads() + 1));
  std::vector<Matmul<T>> parts;
  std::vector<int64_t> ends;  // parts[i]'s items end at ends[i]
  int64_t row = 0, items = 0;
  for (int64_t e = 0; e < wd[0] && row < xd[0]; ++e) {
    const int64_t n = std::clamp<int64_t>(group_sizes.typed_data()[e], 0, xd[0] - row);
    if (n == 0) continue;
    parts.push_back(Matmul<T>{x.typed_data() + row * depth, w.typed_data() + e * panels * depth * kPanel,
                           y->typed_data() + row * width, n, depth, panels, groups});
    items += (n + kChunkRows - 1) / kChunkRows * groups;
    ends.push_back(items);
    row += n;
  }
  std::fill(y->typed_data() + row * width, y->typed_data() + xd[0] * width, 0.0f);
  jaxvllm::ParallelFor(pool, items, [parts, ends](int64_t item, std::vector<float>& scratch) {
    const int64_t i = std::upper_bound(ends.begin(), ends.end(), item) - ends.begin();
    parts[i](item - (i ? ends[i - 1] : 0), scratch);
  });
  return ffi::Error::Success();
}

template <ffi::DataType kType>
auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .template Arg<ffi::Buffer<kType>>()
      .template Arg<ffi::Buffer<kType>>()
      .template Arg<ffi::Buffer<ffi::S32>>()
      .template Ret<ffi::Buffer<ffi::F32>>();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmPackedMatmul, PackedMatmul<ffi::F32>, Binding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmPackedMatmulBf16, PackedMatmul<ffi::BF16>, Binding<ffi::BF16>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmGroupedPackedMatmul, GroupedPackedMatmul<ffi::F32>, Binding<ffi::F32>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmGroupedPackedMatmulBf16, GroupedPackedMatmul<ffi::BF16>, Binding<ffi::BF16>());
