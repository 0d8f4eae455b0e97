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
// x's rows are padded to a compiled bucket; only the first num_rows are real (the step's
// tokens). Those are multiplied and the padding rows of y are zeroed, so a step pays for its
// tokens, not for its bucket (a decode batch of 33 costs half of one of 64).
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "parallel.h"
#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jaxvllm::F16;
using jaxvllm::kLanes;

constexpr int64_t kPanel = 2 * kLanes;  // columns per panel (must match native/packed_matmul.py)
constexpr int64_t kTileRows = 12;       // rows per micro-tile: 2 x 12 accumulators
constexpr int64_t kChunkRows = 192;     // rows per work item: their slice of x stays in L2

struct Matmul {
  const float* x;  // [rows, depth]
  const float* w;  // [panels, depth, kPanel]
  float* y;        // [rows, panels * kPanel]
  int64_t rows, depth, panels, groups;

  // Rows [m, m + R) times panel s; `prefetch` walks the next panel, one line per step.
  template <int R>
  void Tile(int64_t m, int64_t s, const float*& prefetch, const float* prefetch_end) const {
    const float* panel = w + s * depth * kPanel;
    const float* xr = x + m * depth;
    F16 lo[R] = {}, hi[R] = {};
    for (int64_t k = 0; k < depth; ++k) {
      if (prefetch < prefetch_end) {
        __builtin_prefetch(prefetch);
        prefetch += kLanes;
      }
      const F16 b0 = jaxvllm::Load(panel + k * kPanel), b1 = jaxvllm::Load(panel + k * kPanel + kLanes);
      for (int i = 0; i < R; ++i) {
        const float a = xr[i * depth + k];
        lo[i] += a * b0;
        hi[i] += a * b1;
      }
    }
    const int64_t width = panels * kPanel;
    for (int i = 0; i < R; ++i) {
      jaxvllm::Store(y + (m + i) * width + s * kPanel, lo[i]);
      jaxvllm::Store(y + (m + i) * width + s * kPanel + kLanes, hi[i]);
    }
  }

  template <size_t... R>
  void AnyTile(int rows, int64_t m, int64_t s, const float*& pf, const float* pf_end,
               std::index_sequence<R...>) const {
    ((rows == int(R) + 1 ? Tile<int(R) + 1>(m, s, pf, pf_end) : void()), ...);
  }

  // Item: one chunk of rows against one contiguous group of panels, in tiles of even height.
  void operator()(int64_t item, std::vector<float>&) const {
    const int64_t g = item % groups, first = g * panels / groups, last = (g + 1) * panels / groups;
    const int64_t m0 = (item / groups) * kChunkRows, n = std::min(rows - m0, kChunkRows);
    const int64_t tiles = (n + kTileRows - 1) / kTileRows;
    for (int64_t s = first; s < last; ++s) {
      const float* pf = s + 1 < last ? w + (s + 1) * depth * kPanel : nullptr;
      const float* pf_end = pf ? pf + depth * kPanel : nullptr;
      for (int64_t t = 0, m = m0; t < tiles; ++t) {
        const int64_t h = (m0 + n - m + (tiles - t) - 1) / (tiles - t);
        AnyTile(int(h), m, s, pf, pf_end, std::make_index_sequence<kTileRows>{});
        m += h;
      }
    }
  }
};

ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::Buffer<ffi::S32> num_rows, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2)
    return ffi::Error::InvalidArgument("packed_matmul: x must be 2-D, w_packed 3-D and y 2-D");
  if (wd[1] != xd[1] || wd[2] != kPanel)
    return ffi::Error::InvalidArgument("packed_matmul: w_packed must be [out/32, in, 32] with in = x.shape[1]");
  if (yd[0] != xd[0] || yd[1] != wd[0] * kPanel)
    return ffi::Error::InvalidArgument("packed_matmul: y must be [x.shape[0], 32 * w_packed.shape[0]]");
  if (num_rows.element_count() != 1)
    return ffi::Error::InvalidArgument("packed_matmul: num_rows must hold one value");
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, xd[0]);
  std::fill(y->typed_data() + rows * yd[1], y->typed_data() + xd[0] * yd[1], 0.0f);
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  // Two groups of panels per thread: enough to balance, few enough that prefetching pays.
  const int64_t groups = std::min<int64_t>(wd[0], 2 * (pool.num_threads() + 1));
  jaxvllm::ParallelFor(pool, chunks * groups,
                       Matmul{x.typed_data(), w.typed_data(), y->typed_data(), rows, xd[1], wd[0], groups});
  return ffi::Error::Success();
}

// x's rows in consecutive groups (group_sizes[e] rows for expert e), each group times its
// expert's packed weight w[e] ([experts, panels, depth, kPanel]); rows past the last group
// are zeroed. Every group is a Matmul of its own rows (none for an empty one), and the
// items of all of them share one ParallelFor: an expert's weight is read where it lies,
// once per chunk of its rows, where slicing it out in XLA copied it first.
ffi::Error GroupedPackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                               ffi::Buffer<ffi::S32> group_sizes, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 4 || yd.size() != 2)
    return ffi::Error::InvalidArgument("grouped_packed_matmul: x must be 2-D, w_packed 4-D and y 2-D");
  if (wd[2] != xd[1] || wd[3] != kPanel)
    return ffi::Error::InvalidArgument(
        "grouped_packed_matmul: w_packed must be [experts, out/32, in, 32] with in = x.shape[1]");
  if (yd[0] != xd[0] || yd[1] != wd[1] * kPanel)
    return ffi::Error::InvalidArgument("grouped_packed_matmul: y must be [x.shape[0], 32 * w_packed.shape[1]]");
  if (group_sizes.element_count() != wd[0])
    return ffi::Error::InvalidArgument("grouped_packed_matmul: group_sizes must hold one value per expert");
  const int64_t depth = xd[1], panels = wd[1], width = yd[1];
  const int64_t groups = std::min<int64_t>(panels, 2 * (pool.num_threads() + 1));
  std::vector<Matmul> parts;
  std::vector<int64_t> ends;  // parts[i]'s items end at ends[i]
  int64_t row = 0, items = 0;
  for (int64_t e = 0; e < wd[0] && row < xd[0]; ++e) {
    const int64_t n = std::clamp<int64_t>(group_sizes.typed_data()[e], 0, xd[0] - row);
    if (n == 0) continue;
    parts.push_back(Matmul{x.typed_data() + row * depth, w.typed_data() + e * panels * depth * kPanel,
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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmPackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxvllmGroupedPackedMatmul, GroupedPackedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
