// Prints, on the host, the two facts of CUTLASS's W4A8 (int4 x FP8) mixed-input GEMM that vLLM's
// CUTLASS W4A8 MoE conversion relies on (tools/goldens/w4a8_reorder.sh compiles and runs this):
//
// 1. "reorder N K": for every logical int4 element (n, k) of one expert's [N, K] weight (K contiguous,
//    as vLLM's StrideB), the int4 offset that cutlass::reorder_tensor writes it to, i.e. the layout
//    tile_to_shape(compute_memory_reordering_atom<float_e4m3_t>(), make_shape(N, K, _1)) at (n, k, 0).
//    One line per n: K offsets separated by spaces.
// 2. "packed_scale": for each of the 256 E4M3 bytes s, the 8 bytes of
//    cutlass::packed_scale_t<float_e4m3_t, int4b_t>(s), what cutlass::pack_scale_fp8 stores per scale.
//
// Usage: w4a8_reorder reorder N K | w4a8_reorder packed_scale
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/mixed_dtype_utils.hpp"

using namespace cute;

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "reorder") == 0) {
    int n = std::atoi(argv[2]), k = std::atoi(argv[3]);
    using Atom = decltype(cutlass::compute_memory_reordering_atom<cutlass::float_e4m3_t>());
    auto layout = tile_to_shape(Atom{}, make_shape(n, k, Int<1>{}));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < k; ++j) std::printf(j ? " %d" : "%d", int(layout(i, j, 0)));
      std::printf("\n");
    }
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "packed_scale") == 0) {
    for (int b = 0; b < 256; ++b) {
      uint8_t byte = uint8_t(b);
      cutlass::float_e4m3_t s;
      std::memcpy(&s, &byte, 1);
      cutlass::packed_scale_t<cutlass::float_e4m3_t, cutlass::int4b_t> packed(s);
      uint8_t out[8];
      static_assert(sizeof(packed) == 8, "packed_scale_t holds 8 bytes");
      std::memcpy(out, &packed, 8);
      std::printf("%d", b);
      for (int i = 0; i < 8; ++i) std::printf(" %d", out[i]);
      std::printf("\n");
    }
    return 0;
  }
  std::fprintf(stderr, "usage: %s reorder N K | %s packed_scale\n", argv[0], argv[0]);
  return 2;
}
