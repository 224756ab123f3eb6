// The forward's launches for half scores.
#include "forward_ladder.cuh"

namespace sms {
template void launch_forward<c10::Half>(const ForwardParams& p, MaskKind mask_kind, cudaStream_t stream);
}  // namespace sms
