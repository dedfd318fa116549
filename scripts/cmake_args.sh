#!/usr/bin/env bash
# llama.cpp's CMake flags for this machine, defined once for setup.sh, gpu_check.sh and llamacpp_compare.py.
#
#   bash scripts/cmake_args.sh      # prints them (EDGESPEC_CMAKE_ARGS, when set, replaces them entirely)
#
# Sourced, it defines cpu_cmake_args (Linux x86-64: GGML_NATIVE=OFF and the SIMD flags this CPU really reports,
# never AMX: some VMs advertise AMX but fault on `tilezero`) and detect_cmake_args (adds Metal on Apple silicon,
# CUDA where nvcc and a GPU visible to nvidia-smi exist).

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

detect_cmake_args() {
  local args=""
  if [ "$(uname -s)" = "Darwin" ]; then
    [ "$(uname -m)" = "arm64" ] && args="-DGGML_METAL=on"
    echo "$args"; return
  fi
  if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    args="-DGGML_CUDA=on "
  fi
  args+="$(cpu_cmake_args)"
  echo "$args"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "${EDGESPEC_CMAKE_ARGS:-$(detect_cmake_args)}"
fi
