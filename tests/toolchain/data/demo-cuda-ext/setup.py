from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

# torch.utils.cpp_extension finds nvcc and the headers through CUDA_HOME (the builder's
# assembled one) and the architectures through TORCH_CUDA_ARCH_LIST (the derivation's env).
setup(
    ext_modules=[CUDAExtension("halo_demo_cuda", ["module.cpp", "kernel.cu"])],
    cmdclass={"build_ext": BuildExtension},
)
