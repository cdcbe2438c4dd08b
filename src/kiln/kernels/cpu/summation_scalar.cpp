// The fast summation block kernel (summation_impl.inc) compiled for baseline x86-64 (1 lane) into
// kiln::cpu::scalar; the file name's suffix gives it its compiler flags (CMakeLists.txt).
#include "kiln/kernels/cpu/summation_impl.inc"
