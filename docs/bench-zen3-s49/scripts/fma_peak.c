// One thread of independent FMAs (12 accumulators, no memory): the core's FMA peak.
// gcc -O3 -mavx2 -mfma fma_peak.c -o fma_peak && ./fma_peak; then two at once: ./fma_peak & ./fma_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  __m256 a[12]; for(int i=0;i<12;i++) a[i]=_mm256_set1_ps(1.0f+i*1e-7f);
  __m256 b=_mm256_set1_ps(0.9999999f), c=_mm256_set1_ps(1e-7f);
  long n=200000000; double t=now();
  for(long i=0;i<n;i++){
    #pragma GCC unroll 12
    for(int j=0;j<12;j++) a[j]=_mm256_fmadd_ps(a[j],b,c);
  }
  t=now()-t; float s=0; for(int j=0;j<12;j++) s+=a[j][0];
  printf("%.1f GFLOP/s (%.3f FMA/ns) %f\n", n*12.0*16/t/1e9, n*12.0/t/1e9, s);
}
