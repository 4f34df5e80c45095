// <cuda_runtime.h> for the host emulation: everything the kernels use is in cuda_emulation.h.
#pragma once
