// The fast summation block kernel (summation_impl.inc) compiled for AVX-512 (16 lanes) into
// kiln::cpu::avx512; the file name's suffix gives it its compiler flags (CMakeLists.txt).
#include "kiln/kernels/cpu/summation_impl.inc"
