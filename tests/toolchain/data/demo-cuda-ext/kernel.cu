// Device code for the architectures nvcc was asked for, and host code that reports them.
#include <cuda_runtime.h>

#define HALO_STR2(x) #x
#define HALO_STR(x) HALO_STR2(x)

__global__ void halo_scale(float *x, float by, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= by;
}

// nvcc defines __CUDA_ARCH_LIST__ in the host pass too: the SM versions it compiled for.
extern "C" const char *halo_demo_arch_list() { return HALO_STR(__CUDA_ARCH_LIST__); }

// Without a GPU this is an error code, which proves libcudart was linked and loads.
extern "C" int halo_demo_device_status() {
    int n = 0;
    return static_cast<int>(cudaGetDeviceCount(&n));
}
