#!/usr/bin/env bash
# llama.cpp's CMake flags for this machine, defined once for setup.sh, gpu_check.sh and llamacpp_compare.py.
#
#   bash scripts/cmake_args.sh      # prints them (EDGESPEC_CMAKE_ARGS, when set, replaces them entirely)
#
# Sourced, it defines cpu_cmake_args (Linux x86-64: GGML_NATIVE=OFF and the SIMD flags this CPU really reports,
# never AMX: some VMs advertise AMX but fault on `tilezero`) and detect_cmake_args (adds Metal on Apple silicon,
# CUDA where nvcc and a GPU visible to nvidia-smi exist), and cuda_cmake_args ARCH (a CUDA build for compute
# capability ARCH, e.g. 90 for an H100/H200, made on any machine with nvcc, a GPU or not: EDGESPEC_CUDA_ARCH).
# Every build has llama.cpp's RPC backend (rpc_cmake_args: libggml-rpc, loaded only when `--rpc`/`rpc-server` is used).

# ggml's RPC backend (edgespec rpc-server, ModelSpec(rpc=...)): a separate library, nothing changes where it is unused
rpc_cmake_args() {
  echo "-DGGML_RPC=ON"
}

cpu_cmake_args() {
  local args=""
  if [ "$(uname -m)" = "x86_64" ] && [ -r /proc/cpuinfo ]; then
    local flags
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { case "$flags" in *" $1 "*) return 0;; *) return 1;; esac; }
    args+="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    has avx && args+=" -DGGML_AVX=ON"
    has avx2 && args+=" -DGGML_AVX2=ON"
    has fma && args+=" -DGGML_FMA=ON"
    has f16c && args+=" -DGGML_F16C=ON"
    has bmi2 && args+=" -DGGML_BMI2=ON"
    has avx_vnni && args+=" -DGGML_AVX_VNNI=ON"
    if has avx512f; then
      args+=" -DGGML_AVX512=ON"
      has avx512vbmi && args+=" -DGGML_AVX512_VBMI=ON"
      has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
      has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
    fi
  fi
  echo "$args"
}

# x86-64-v3 (AVX2, FMA, F16C, BMI2): the CPU flags of a build that travels to another machine (a prebuilt CUDA wheel)
portable_cpu_cmake_args() {
  [ "$(uname -m)" = "x86_64" ] || return 0
  echo "-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
}

# cuBLAS's folder where the CUDA toolkit lacks it: EDGESPEC_CUBLAS_DIR, else Python's nvidia wheels (nvidia/cu13/lib)
find_cublas_dir() {
  local nvcc_dir sp d
  nvcc_dir="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  if [ -n "${EDGESPEC_CUBLAS_DIR:-}" ]; then echo "$EDGESPEC_CUBLAS_DIR"; return; fi
  ls "$nvcc_dir"/lib64/libcublas.so* "$nvcc_dir"/targets/*/lib/libcublas.so* >/dev/null 2>&1 && return 0
  for sp in $(${PYTHON:-python3} -c 'import site, sys; print(" ".join(site.getsitepackages() + sys.path))' 2>/dev/null); do
    [ -d "$sp/nvidia" ] || continue
    d="$(dirname "$(find "$sp/nvidia" -name 'libcublas.so*' 2>/dev/null | head -1)")"
    [ "$d" != . ] && { echo "$d"; return; }
  done
}

# A CUDA build for compute capability $1 (90 = Hopper): only that architecture, no NCCL, no tools, and no direct link
# to the driver (GGML_CUDA_NO_VMM: libcuda is opened at run time, so a machine without the driver loads the library
# and runs on the CPU). cuBLAS outside the toolkit (find_cublas_dir) is passed explicitly.
cuda_cmake_args() {
  local arch="$1" args cublas inc
  args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${arch}-real -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_NO_VMM=ON -DLLAVA_BUILD=OFF"
  args+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF"
  cublas="$(find_cublas_dir)"
  if [ -n "$cublas" ]; then
    inc="$(dirname "$cublas")/include"
    args+=" -DCUDA_cublas_LIBRARY=$(ls "$cublas"/libcublas.so* | head -1) -DCUDA_cublasLt_LIBRARY=$(ls "$cublas"/libcublasLt.so* | head -1)"
    args+=" -DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc"
  fi
  echo "$args"
}

detect_cmake_args() {
  local args=""
  if [ -n "${EDGESPEC_CUDA_ARCH:-}" ]; then  # a CUDA build asked for by name: it may be made for another machine
    echo "$(cuda_cmake_args "$EDGESPEC_CUDA_ARCH") $(portable_cpu_cmake_args) $(rpc_cmake_args)"; return
  fi
  if [ "$(uname -s)" = "Darwin" ]; then
    [ "$(uname -m)" = "arm64" ] && args="-DGGML_METAL=on "
    echo "$args$(rpc_cmake_args)"; return
  fi
  if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    args="-DGGML_CUDA=on "
  fi
  args+="$(cpu_cmake_args) $(rpc_cmake_args)"
  echo "$args"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "${EDGESPEC_CMAKE_ARGS:-$(detect_cmake_args)}"
fi
