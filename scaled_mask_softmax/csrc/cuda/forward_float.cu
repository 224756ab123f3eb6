// The forward's launches for float scores.
#include "forward_ladder.cuh"

namespace sms {
template void launch_forward<float>(const ForwardParams& p, MaskKind mask_kind, cudaStream_t stream);
}  // namespace sms
