// The forward's launches for double scores.
#include "forward_ladder.cuh"

namespace sms {
template void launch_forward<double>(const ForwardParams& p, MaskKind mask_kind, cudaStream_t stream);
}  // namespace sms
