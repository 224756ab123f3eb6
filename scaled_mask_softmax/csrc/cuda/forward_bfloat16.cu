// The forward's launches for bfloat16 scores.
#include "forward_ladder.cuh"

namespace sms {
template void launch_forward<c10::BFloat16>(const ForwardParams& p, MaskKind mask_kind, cudaStream_t stream);
}  // namespace sms
