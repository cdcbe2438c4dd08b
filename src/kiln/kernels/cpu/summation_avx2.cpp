// The fast summation block kernel (summation_impl.inc) compiled for AVX2 + FMA (8 lanes) into
// kiln::cpu::avx2; the file name's suffix gives it its compiler flags (CMakeLists.txt).
#include "kiln/kernels/cpu/summation_impl.inc"
